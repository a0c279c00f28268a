"""Graph execution: the forward pass as one compiled plan on persistent threads."""
