"""The node pipeline every serving command shares: config in, one value per change out.

Sources, GPU discovery, health, MIG layouts and the node's reports live here; what a command does
with each `Applied` lives in that command's room beside this one.
"""
