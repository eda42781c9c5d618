"""lumotree.agents"""
