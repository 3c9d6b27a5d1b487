"""Suites: a config file → one resumable run of native and browser work (config, plan), executed on
this machine in device groups (local) or on a Ray cluster (ray), started by run."""
