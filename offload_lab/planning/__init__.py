"""Where each layer lives between uses: host memory and the reserve rule, the planner, pipelines."""
