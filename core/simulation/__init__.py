"""The discrete-event simulator behind `baton simulate`: the real engine on a simulated executor
and clock, workloads and traces.
"""
