"""The fleet view: every node of a cluster planned from its labels, before a config applies.

A node's GPUs are rebuilt from the labels gpu-feature-discovery (or this plugin) put on it,
then planned with the same pipeline as one node; the labels' own rules come from the label
view below, so this package sits above the views.
"""
