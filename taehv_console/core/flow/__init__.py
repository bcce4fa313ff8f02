"""The console's flow as one typed API over core, one module per step:

    options   FlowOptions: what a front end asks for (no argparse below the CLI)
    detect    the topology and every node's probe
    config    the config for --preset/auto, --set, --data (or a run's run.toml); preset choices
    preflight backend (BackendKind), master port, core's checks -> PreflightResult
    launch    launch spec, review (plan figures + exact per-node commands), a platform pod's node
    runs      which runs exist and which one is live (the one definition)
    trust     host-key trust of exactly the key shown

The TUI, `--no-tui` and the CLI commands all call these. The package itself re-exports nothing, so
importing one step (the CLI's options) does not load the planner's pydantic models.
"""
