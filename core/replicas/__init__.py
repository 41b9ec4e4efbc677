"""The front end's view of engine replicas and the router that picks one per request."""
