"""lumotree.dashboards"""
