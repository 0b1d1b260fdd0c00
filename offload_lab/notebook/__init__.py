"""The Jupyter layer: PlanExplorer widgets and the %offload_profile magic (imported lazily)."""
