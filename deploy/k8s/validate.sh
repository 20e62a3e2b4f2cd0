#!/usr/bin/env bash
# Validate a kustomization offline: `kubectl kustomize DIR` (deploy/k8s by default), every resource of it
# checked by kubeconform against the JSON schemas kept in deploy/k8s/schemas/ (Kubernetes 1.36 kinds, the
# Strimzi and CloudNativePG CRDs: schemas/SOURCE), strict (no field a schema does not know, no duplicate
# key), and nothing downloaded: a kind without a schema here is an error, not a skip.
#
#   deploy/k8s/validate.sh [DIR]        KUBECONFORM (.cache/bin/kubeconform: make k8s-tools), KUBECTL (kubectl)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-$ROOT/deploy/k8s}"
KUBECONFORM="${KUBECONFORM:-$ROOT/.cache/bin/kubeconform}"
KUBECTL="${KUBECTL:-kubectl}"
SCHEMAS="$ROOT/deploy/k8s/schemas"

[[ -x "$KUBECONFORM" ]] || { echo "validate.sh: no kubeconform at $KUBECONFORM (make k8s-tools)" >&2; exit 2; }
rendered="$(mktemp --suffix .yaml)"  # kubeconform reads .yaml files only
trap 'rm -f "$rendered"' EXIT
"$KUBECTL" kustomize "$DIR" >"$rendered"
"$KUBECONFORM" -strict -summary -output text \
    -schema-location "$SCHEMAS/kubernetes/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$SCHEMAS/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
    "$rendered"
