"""What a checkpoint folder holds, read without torch: its config, rotary settings, and which model
implementation serves it.
"""
