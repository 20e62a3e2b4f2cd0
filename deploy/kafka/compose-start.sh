#!/usr/bin/env bash
# The broker of docker-compose.yml: the same security as deploy/local/kafka.sh (SASL/SCRAM-SHA-512 on
# every client listener, the StandardAuthorizer, nothing allowed without an ACL, the admin super user),
# with the principals of the mounted credentials file bootstrapped when the data dir is first formatted.
# The ACLs are written afterwards by the topic-init one-shot (python -m gangline.bus.acl apply).
set -euo pipefail

CREDENTIALS="${GANGLINE_KAFKA_CREDENTIALS:-/run/secrets/kafka_credentials}"
DATA=/var/lib/kafka/data
PROPS=/tmp/server.properties

# `name password` per line of the YAML map name: password (no YAML parser in the image: one flat map).
mapfile -t creds < <(sed -n -E 's/^([A-Za-z0-9._-]+):[[:space:]]*"?([^"#[:space:]]+)"?.*$/\1 \2/p' "$CREDENTIALS")
admin_pw=""
scram=()
for line in "${creds[@]}"; do
    read -r name password <<<"$line"
    [[ "$name" == admin ]] && admin_pw="$password"
    scram+=(--add-scram "SCRAM-SHA-512=[name=$name,password=$password]")
done
[[ -n "$admin_pw" ]] || { echo "compose-start.sh: no admin password in $CREDENTIALS" >&2; exit 1; }

umask 077
cat >"$PROPS" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@kafka:9093
listeners=CLIENT://:9092,CONTROLLER://:9093,HOST://:29092
advertised.listeners=CLIENT://kafka:9092,HOST://127.0.0.1:29092
controller.listener.names=CONTROLLER
inter.broker.listener.name=CLIENT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,CLIENT:SASL_PLAINTEXT,HOST:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
listener.name.host.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_pw" user_admin="$admin_pw";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
log.dirs=$DATA
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS

# For the healthcheck (kafka-broker-api-versions.sh --command-config): the admin, on the client listener.
cat >/tmp/admin-client.properties <<CLIENT
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
CLIENT

if [[ ! -f "$DATA/meta.properties" ]]; then
    /opt/kafka/bin/kafka-storage.sh format -t "$(/opt/kafka/bin/kafka-storage.sh random-uuid)" -c "$PROPS" \
        "${scram[@]}" >/dev/null
fi
exec /opt/kafka/bin/kafka-server-start.sh "$PROPS"
