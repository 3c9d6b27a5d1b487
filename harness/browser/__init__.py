"""The browser's pipelines: a launched or remote browser (run.py), served devices (serve.py), a generate case's job
fields and row (generate.py), and `accelharness run` (both.py: native, then the browser)."""
