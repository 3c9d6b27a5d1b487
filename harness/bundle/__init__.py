"""Results that travel between stores: `export --bundle` (export.py, redact.py), `import` and `merge`
(importer.py), the bundle format and its checks (fmt.py). Every part reads and writes the store
through harness.store."""
