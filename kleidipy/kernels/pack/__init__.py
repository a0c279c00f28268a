"""Packers, packer inputs and adaptors that serve more than one family (KleidiAI's ``kai/ukernels/matmul/pack/``):
not a family itself (no ``FAMILY`` record), imported by the families that share it."""
