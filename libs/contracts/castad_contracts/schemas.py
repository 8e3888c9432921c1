"""Write every event's JSON Schema (and the envelope's and brief's) to files.

Usage: python -m castad_contracts.schemas OUTPUT_DIR
"""

from __future__ import annotations

import json
import pathlib
import sys

from castad_contracts import brief, envelope, events


def write_schemas(directory: pathlib.Path) -> list[pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    documents: dict[str, dict[str, object]] = {
        "envelope.schema.json": envelope.Envelope.model_json_schema(),
        "brief.schema.json": brief.Brief.model_json_schema(),
    }
    for (event_type, version), model in events.REGISTRY.items():
        schema = model.model_json_schema()
        schema["$id"] = f"urn:castad:event:{event_type}:v{version}"
        schema["title"] = f"{event_type} v{version}"
        documents[f"{event_type}.v{version}.schema.json"] = schema
    written = []
    for name, schema in documents.items():
        path = directory / name
        path.write_text(json.dumps(schema, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        written.append(path)
    return written


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m castad_contracts.schemas OUTPUT_DIR")
    for path in write_schemas(pathlib.Path(sys.argv[1])):
        print(path)


if __name__ == "__main__":
    main()
