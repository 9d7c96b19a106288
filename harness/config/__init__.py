"""A run's configuration, resolved once at the edge (the command line, a TOML file, the Python API): ``run_config``
(``RunConfig``, every setting with its rule, the run id, reading and writing ``config.toml``), ``frontend`` (how each
front end spells an option in its messages), ``precision`` (the autocast modes). Below the rooms that run an
evaluation, above the plugin contract (``harness.api``), which it checks options against."""
