from .cluster import Cluster, Fabric
from .hardware import GPU, NIC, Node
from .serving import Gateway, ServedModel, Worker

__all__ = ["GPU", "NIC", "Cluster", "Fabric", "Gateway", "Node", "ServedModel", "Worker"]
