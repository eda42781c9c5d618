"""lumotree.serving"""
