"""Issue a bearer token for a node's agent: `manage.py create_agent_token <cluster> <host>`.

The token is printed once; only its SHA-256 digest is stored. Issuing a new token
revokes the old one. ``--create`` adds the node (and cluster) when they do not exist.
"""

from django.core.management.base import BaseCommand, CommandError

from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Node


class Command(BaseCommand):
    help = "Issue (or rotate) the agent bearer token of a node and print it once."

    def add_arguments(self, parser):
        parser.add_argument("cluster", help="Cluster name")
        parser.add_argument("hostname", help="Node hostname, as the agent reports it")
        parser.add_argument("--create", action="store_true",
                            help="Create the cluster and node when missing")

    def handle(self, *args, cluster, hostname, create, **options):
        if create:
            cluster_obj, _ = Cluster.objects.get_or_create(name=cluster)
            node, _ = Node.objects.get_or_create(cluster=cluster_obj, hostname=hostname)
        else:
            node = Node.objects.filter(cluster__name=cluster, hostname=hostname).first()
            if node is None:
                raise CommandError(f"no node {hostname!r} in cluster {cluster!r} "
                                   "(use --create to add it)")
        self.stdout.write(issue_token(node))
