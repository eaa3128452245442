"""The kubelet's pod-resources service (v1 `List`) on a unix socket, generated from the upstream proto file.

    podresources_server.py PROTO SOCKET ANSWER_JSON

The messages are compiled from PROTO (node-agent/proto/podresources-v1.proto, copied from Kubernetes) by
grpcio-tools, so the wire format is the upstream file's, not the agent's idea of it. `List` answers the
ListPodResourcesResponse in ANSWER_JSON (protobuf's JSON mapping) and appends each call's metadata path to
SOCKET + ".calls". Prints `ready` once it listens.
"""

import json
import os
import sys
import tempfile
from concurrent import futures

import grpc
from grpc_tools import protoc
from google.protobuf import json_format


def main() -> None:
    proto, socket, answer = sys.argv[1:4]
    out = tempfile.mkdtemp()
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main([
        "protoc", f"-I{os.path.dirname(proto)}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
        os.path.basename(proto),
    ])
    if rc != 0:
        sys.exit(f"protoc failed: {rc}")
    sys.path.insert(0, out)
    stem = os.path.basename(proto)[: -len(".proto")].replace("-", "_")
    pb = __import__(f"{stem}_pb2")
    pb_grpc = __import__(f"{stem}_pb2_grpc")

    class Lister(pb_grpc.PodResourcesListerServicer):
        def List(self, request, context):  # noqa: N802 (the service's name)
            with open(socket + ".calls", "a") as f:
                f.write("List\n")
            with open(answer) as f:
                return json_format.Parse(f.read(), pb.ListPodResourcesResponse())

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
