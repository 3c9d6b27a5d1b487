"""From a spec to what every engine runs: specs → workload (module, weights) + inputs → export (ONNX,
cached; export_past; variants: its fp16/int8 conversions) → prepared (a PreparedModel: files, inputs and
reference outputs). cache says where it all lives."""
