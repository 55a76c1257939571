"""Generated protobuf/gRPC code of the xaudit.v1 API (python proto/gen_proto.py); do not edit."""
