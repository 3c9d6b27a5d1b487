"""Declarative model specs (one TOML file per model), shipped as package data of harness."""
