"""Graph execution: the forward pass as one compiled plan on persistent threads. It sits below the runtime and
imports nothing of it: the model comes in as the Protocols of ``model``, and the ops it runs are
:mod:`kleidipy.ops`'s."""
