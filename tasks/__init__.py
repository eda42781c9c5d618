"""lumotree.tasks"""
