"""The scheduler mechanism, its policies, and the models they plan with: step cost, feasibility,
output lengths.
"""
