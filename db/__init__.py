"""lumotree.db"""
