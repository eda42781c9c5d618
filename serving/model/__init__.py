"""The hybrid model: ``HybridModel`` (GDN + gated attention), its MTP head, and tree-mode records."""

from .model import MTP, DecoderLayer, HybridModel
from .record import GDNReplay, TreeRecord

__all__ = ["MTP", "DecoderLayer", "GDNReplay", "HybridModel", "TreeRecord"]
