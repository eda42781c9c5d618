"""lumotree.kernels"""
