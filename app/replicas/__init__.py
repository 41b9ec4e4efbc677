"""`baton serve --replicas N`: engine replicas as Ray actors and the front end's engine over
them."""
