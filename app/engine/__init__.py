"""The front end's side of the engine: admission of a request and the bridge to the step thread."""
