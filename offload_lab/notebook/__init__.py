"""The Jupyter layer: ``ExplorerState`` (the explorer's logic, no widgets), its ipywidgets view
``PlanExplorer``, figure display bundles and the %offload_profile magic (all imported lazily)."""
