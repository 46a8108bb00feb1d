"""Images in a model's prompt: the vision encoder of an mmproj GGUF file (its configuration,
the image's pre-processing, the encoder's forward pass on a Builder, and the encoder's device
state, warm or cold with its text model)."""
