"""The `pyctl` command line: one module per subcommand."""
