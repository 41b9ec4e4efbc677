"""Engine logic without torch: requests, scheduling, the KV block pool, the step loop."""
