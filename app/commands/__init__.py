"""The `baton bench` and `baton simulate` subcommands."""
