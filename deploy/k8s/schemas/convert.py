"""Make the JSON schemas kubeconform validates deploy/k8s against, offline, from their published sources.

The openapi2jsonschema approach (as kubeconform's own schema repositories are made), written for this
repository: one standalone, strict JSON schema per kind, every ``$ref`` inlined, every object that lists
its properties closed to others (``additionalProperties: false``, unless the schema keeps unknown fields),
descriptions dropped (they are most of the bytes and validate nothing).

    python deploy/k8s/schemas/convert.py kubernetes SWAGGER.json OUT_DIR Kind:group/version ...
    python deploy/k8s/schemas/convert.py crd CRD.yaml ... OUT_DIR

Kubernetes kinds are written as ``<kind>-<group>-<version>.json`` (``<kind>-<version>.json`` for the
core group), kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json``; a CRD's served versions as
``<group>/<kind>_<version>.json``, its ``{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json``.
Where each input came from (repository, commit, path) is in SOURCE beside this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
QUANTITY = {"oneOf": [{"type": "string"}, {"type": "number"}]}
SPECIAL = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": INT_OR_STRING,
    "io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY,
}


def strict(node: Any, definitions: dict[str, Any] | None = None, seen: frozenset[str] = frozenset()) -> Any:
    """``node`` with its refs inlined (from ``definitions``), closed objects and no descriptions."""
    if isinstance(node, list):
        return [strict(item, definitions, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and definitions is not None:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in SPECIAL:
            return SPECIAL[name]
        if name in seen:  # a recursive type (JSONSchemaProps): anything below this depth
            return {}
        return strict(definitions[name], definitions, seen | {name})
    if node.get("x-kubernetes-int-or-string") or node.get("format") == "int-or-string":
        return INT_OR_STRING
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: strict(v, definitions, seen) for name, v in value.items()}
        else:
            out[key] = strict(value, definitions, seen)
    keeps_unknown = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def kubernetes(swagger: Path, out: Path, kinds: list[str]) -> None:
    definitions = json.loads(swagger.read_text(encoding="utf-8"))["definitions"]
    wanted = {}
    for item in kinds:  # Kind:group/version, group empty for the core API
        kind, api = item.split(":", 1)
        group, version = api.rsplit("/", 1) if "/" in api else ("", api)
        wanted[(group, version, kind)] = item
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            key = (gvk["group"], gvk["version"], gvk["kind"])
            if key not in wanted:
                continue
            wanted.pop(key)
            doc = strict(schema, definitions, frozenset({name}))
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            doc["properties"]["apiVersion"] = {"type": "string", "enum": [api_version]}
            doc["properties"]["kind"] = {"type": "string", "enum": [gvk["kind"]]}
            doc["$schema"] = "http://json-schema.org/schema#"
            group = f"-{gvk['group'].split('.')[0]}" if gvk["group"] else ""
            suffix = f"{group}-{gvk['version']}"
            write(out / f"{gvk['kind'].lower()}{suffix}.json", doc)
    if wanted:
        sys.exit(f"not in {swagger}: {sorted(wanted.values())}")


def crds(files: list[Path], out: Path) -> None:
    for path in files:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served"):
                continue
            doc = strict(version["schema"]["openAPIV3Schema"])
            doc["$schema"] = "http://json-schema.org/schema#"
            target = out / spec["group"] / f"{spec['names']['kind'].lower()}_{version['name']}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            write(target, doc)


def write(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "kubernetes":
        kubernetes(Path(argv[1]), Path(argv[2]), argv[3:])
    elif len(argv) >= 3 and argv[0] == "crd":
        crds([Path(a) for a in argv[1:-1]], Path(argv[-1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
