"""What a model is: specs of its tensors and layer groups, checkpoint headers, the catalog, FLOPs, and runnable synthetic models."""
