"""From a spec to what every engine runs: specs → workload (module, weights) + inputs → export (ONNX,
cached; export_past) → prepared (a PreparedModel: files, inputs and reference outputs)."""
