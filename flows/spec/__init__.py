"""The run's specification: Ray's grouped configs, the checked `RunSpec`, run arguments as stored."""
