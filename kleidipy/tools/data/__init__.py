"""Data of the tools: KleidiAI's hot-loop counts (``kleidiai_hot_loops.json``, made by ``scripts/kleidiai-hot-loops``
from KleidiAI's sources), read by :mod:`kleidipy.tools.kernel_asm`."""
