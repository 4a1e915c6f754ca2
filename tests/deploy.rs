//! `deploy/` checked against the code, without servers, Docker or a cluster:
//!
//! * the Kubernetes manifests and the CloudFormation template parse, and say what the
//!   service needs (a grace period that covers the drain, probes on the status port,
//!   a locked-down pod, a lease table with PITR and deletion protection and without
//!   flotilla's index, a worker table named as the workers derive it with the heartbeat
//!   index, metrics fenced by namespace);
//! * the IAM policies grant exactly the AWS actions the adapters call, on the resources
//!   they call them on, no more and no fewer, for each source (a Kinesis stream, a
//!   DynamoDB table's stream) and read mode: each adapter's `IAM_ACTIONS` is checked
//!   against the SDK calls in its source, and the policies against the union of the
//!   `IAM_ACTIONS` of the adapters a worker of that source uses, less what a worker
//!   never does, each action on the resources it acts on (for the lease adapter, per
//!   table: [`LEASE_ADAPTER_TABLES`]); and a worker with a dead-letter destination
//!   (`failure.destination`, a Kinesis stream or an SQS queue) is granted exactly the
//!   calls that writes it in `actors/src/failure/` makes, on that destination
//!   ([`DEAD_LETTER_WRITERS`]), by the stack with `DeadLetterStream` or `DeadLetterQueue`
//!   and by a standalone policy of its own;
//! * the Dockerfile is multi-stage, runs as a numeric non-root user and stops on SIGTERM.
//!
//! The CloudFormation template uses the short-form tags (`!Ref`, `!Sub`, `!GetAtt`...);
//! serde_yaml_ng keeps them as `Value::Tagged`, which [`tagged`] unwraps, and [`Stack`]
//! evaluates the few the template uses (conditions, rules, outputs) for given parameters.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_actors::backend::aws::{
    CLOUDWATCH_IAM_ACTIONS, DYNAMODB_IAM_ACTIONS, DYNAMODB_STREAMS_IAM_ACTIONS, KINESIS_IAM_ACTIONS,
};
use flotilla_actors::backend::layout::{WORKER_TABLE_SUFFIX, worker_table_name};
use flotilla_actors::model::item::{HEARTBEAT_INDEX, HEARTBEAT_INDEX_PROJECTION, attr};
use flotilla_actors::model::{Source, SourceKind};
use flotilla_actors::settings::{Destination, Settings};
use serde_yaml_ng::Value;

/// What a permission is on: the role of its IAM resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum On {
    /// The Kinesis stream (`…:stream/NAME`).
    Stream,
    /// The fan-out consumer (`…:stream/NAME/consumer/CONSUMER:*`).
    Consumer,
    /// The source table's streams (`…:table/TABLE/stream/*`).
    TableStream,
    /// The source table itself (`…:table/TABLE`), to find its current stream.
    SourceTable,
    /// The lease table (`…:table/APPLICATION`): lease rows only.
    LeaseTable,
    /// The worker table (`…:table/APPLICATION-FlotillaWorkers`): the heartbeats and
    /// the roster.
    WorkerTable,
    /// The worker table's heartbeat index
    /// (`…:table/APPLICATION-FlotillaWorkers/index/flotilla-heartbeats`), which a round
    /// Queries.
    WorkerTableIndex,
    /// `*`: PutMetricData has no resource-level permissions (a condition fences it).
    Anything,
    /// The dead-letter stream (`…:stream/DEAD_LETTER_STREAM`).
    DeadLetterStream,
    /// The dead-letter queue (`…:sqs:REGION:ACCOUNT:QUEUE`).
    DeadLetterQueue,
}

/// An action on a resource.
type Permission = (String, On);

/// One adapter in `actors/src/backend/aws/`.
struct Adapter {
    file: &'static str,
    /// Its SDK clients, as [`sdk_operations`] finds them: the scan's anchors.
    clients: &'static [&'static str],
    /// The IAM service prefix of its actions.
    service: &'static str,
    /// Its `IAM_ACTIONS`.
    declared: &'static [&'static str],
    /// Actions the file calls that a deployed worker never makes, so no policy in
    /// `deploy/` grants them (whether or not `IAM_ACTIONS` lists them).
    never_granted: &'static [&'static str],
    /// The sources whose workers use it.
    sources: &'static [SourceKind],
    /// What each of its actions is on (one resource, or several: the lease adapter
    /// makes some calls on both of its tables).
    on: fn(&str) -> &'static [On],
}

const EVERY_SOURCE: &[SourceKind] = &[SourceKind::Kinesis, SourceKind::DynamoDbStreams];

/// The four adapters. A Kinesis worker reads with `kinesis.rs`, a table-stream worker
/// with `dynamodb_streams.rs` (and makes no Kinesis call); both keep their leases with
/// `dynamodb.rs` and publish with `cloudwatch.rs`.
const ADAPTERS: &[Adapter] = &[
    Adapter {
        file: "kinesis.rs",
        clients: &["client"],
        service: "kinesis",
        declared: KINESIS_IAM_ACTIONS,
        // StreamAdmin's calls (the demo's producer, tests, operators) and
        // `flotilla consumer deregister`. (PutRecords is granted on a dead-letter stream
        // only: DEAD_LETTER_WRITERS.)
        never_granted: &[
            "kinesis:CreateStream",
            "kinesis:DeleteStream",
            "kinesis:PutRecords",
            "kinesis:SplitShard",
            "kinesis:MergeShards",
            "kinesis:DeregisterStreamConsumer",
        ],
        sources: &[SourceKind::Kinesis],
        on: |action| {
            if ON_THE_CONSUMER.contains(&action) {
                &[On::Consumer]
            } else {
                &[On::Stream]
            }
        },
    },
    Adapter {
        file: "dynamodb_streams.rs",
        clients: &[".streams", ".tables"],
        service: "dynamodb",
        declared: DYNAMODB_STREAMS_IAM_ACTIONS,
        // TableStreamAdmin's calls on a source table (the demo's and tests'), which
        // IAM_ACTIONS leaves out. (Its wait for a new table also calls DescribeTable,
        // which a worker makes too, to find a table's current stream.)
        never_granted: &[
            "dynamodb:CreateTable",
            "dynamodb:DeleteTable",
            "dynamodb:PutItem",
            "dynamodb:DeleteItem",
        ],
        sources: &[SourceKind::DynamoDbStreams],
        on: |action| {
            if action == "dynamodb:DescribeTable" {
                &[On::SourceTable]
            } else {
                &[On::TableStream]
            }
        },
    },
    Adapter {
        file: "dynamodb.rs",
        clients: &["client"],
        service: "dynamodb",
        declared: DYNAMODB_IAM_ACTIONS,
        // `flotilla destroy`'s and `flotilla init`'s table options. (`flotilla init`'s
        // UpdateTable for deletion protection, on the lease table, is the same action as
        // a worker's UpdateTable of the worker table, which LEASE_ADAPTER_TABLES grants
        // on the worker table only.)
        never_granted: &[
            "dynamodb:DeleteTable",
            "dynamodb:DescribeContinuousBackups",
            "dynamodb:UpdateContinuousBackups",
            "dynamodb:TagResource",
        ],
        sources: EVERY_SOURCE,
        on: |action| {
            LEASE_ADAPTER_TABLES
                .iter()
                .find(|(a, _)| *a == action)
                .map(|(_, on)| *on)
                .unwrap_or_else(|| {
                    panic!("{action}: LEASE_ADAPTER_TABLES does not say which table it is on")
                })
        },
    },
    Adapter {
        file: "cloudwatch.rs",
        clients: &["client"],
        service: "cloudwatch",
        declared: CLOUDWATCH_IAM_ACTIONS,
        never_granted: &[],
        sources: EVERY_SOURCE,
        on: |_| &[On::Anything],
    },
];

/// Which of its two tables (`flotilla_actors::backend::layout`) each of the lease
/// adapter's worker calls acts on, mirroring `actors/src/backend/aws/dynamodb.rs` (its
/// `IAM_ACTIONS` is the union, and its doc comment says the same split): the lease
/// table holds lease rows only, so that the Java KCL, which reads every row of it as a
/// lease, can share it; flotilla's heartbeat rows and roster are in the worker table.
///
/// On the lease table: the leases (Scan to list them, PutItem to create one, GetItem,
/// UpdateItem, DeleteItem), and the legacy rows an older flotilla left there (read with
/// the Scan and BatchGetItem, written and retired with UpdateItem and DeleteItem,
/// checked in a take's TransactWriteItems with ConditionCheckItem). No UpdateTable (the
/// lease table has no index of flotilla's) and no Query.
///
/// On the worker table: UpdateTable only to add the heartbeat index to a table that
/// lacks it; the rows are written with UpdateItem, never PutItem, and read with
/// BatchGetItem, Scan or a Query of the index, never GetItem.
const LEASE_ADAPTER_TABLES: &[(&str, &[On])] = &[
    ("dynamodb:DescribeTable", &[On::LeaseTable, On::WorkerTable]),
    ("dynamodb:CreateTable", &[On::LeaseTable, On::WorkerTable]),
    ("dynamodb:UpdateTable", &[On::WorkerTable]),
    ("dynamodb:Scan", &[On::LeaseTable, On::WorkerTable]),
    ("dynamodb:Query", &[On::WorkerTableIndex]),
    ("dynamodb:GetItem", &[On::LeaseTable]),
    ("dynamodb:BatchGetItem", &[On::LeaseTable, On::WorkerTable]),
    ("dynamodb:PutItem", &[On::LeaseTable]),
    ("dynamodb:UpdateItem", &[On::LeaseTable, On::WorkerTable]),
    ("dynamodb:DeleteItem", &[On::LeaseTable, On::WorkerTable]),
    (
        "dynamodb:ConditionCheckItem",
        &[On::LeaseTable, On::WorkerTable],
    ),
];

/// What writes a dead-letter destination (`failure.destination`, issue 32), in
/// `actors/src/failure/`: a worker whose `[failure]` policy discards records makes these
/// calls, on the destination only, and no other worker makes them.
struct DeadLetterWriter {
    /// The stack's parameter naming the destination.
    parameter: &'static str,
    /// The writer's source file, from the repository's root.
    file: &'static str,
    /// What it calls through, as [`sdk_operations`] finds them: an SDK client, or the
    /// Kinesis adapter (whose `IAM_ACTIONS` must list the action too).
    clients: &'static [&'static str],
    /// The IAM service prefix of its actions.
    service: &'static str,
    /// Its `IAM_ACTIONS`.
    declared: &'static [&'static str],
    /// What its actions are on.
    on: On,
    /// The standalone policy that grants them, attached beside the worker's.
    policy: &'static str,
}

const DEAD_LETTER_WRITERS: &[DeadLetterWriter] = &[
    DeadLetterWriter {
        parameter: "DeadLetterStream",
        file: "actors/src/failure/stream.rs",
        clients: &[".streams"],
        service: "kinesis",
        declared: flotilla_actors::failure::stream::IAM_ACTIONS,
        on: On::DeadLetterStream,
        policy: "deploy/iam-policy-dead-letter-stream.json",
    },
    DeadLetterWriter {
        parameter: "DeadLetterQueue",
        file: "actors/src/failure/sqs.rs",
        clients: &["client"],
        service: "sqs",
        declared: flotilla_actors::failure::sqs::IAM_ACTIONS,
        on: On::DeadLetterQueue,
        policy: "deploy/iam-policy-dead-letter-queue.json",
    },
];

/// What only a worker in fan-out mode calls (reader.mode = "fanout", Kinesis only):
/// granted by the stack with `ReadMode=fanout`, and by `deploy/iam-policy-fanout.json`.
const FANOUT_ONLY: &[&str] = &[
    "kinesis:RegisterStreamConsumer",
    "kinesis:ListStreamConsumers",
    "kinesis:DescribeStreamConsumer",
    "kinesis:SubscribeToShard",
];

/// The actions on a fan-out consumer's ARN rather than the stream's.
const ON_THE_CONSUMER: &[&str] = &["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"];

/// Not granted by the CloudFormation stack, which makes both tables itself, the worker
/// table with its heartbeat index (a worker calls CreateTable only when a table is
/// missing, and UpdateTable only when the worker table lacks the index). The standalone
/// policies, for tables made by the first worker, do grant them.
const MADE_BY_THE_STACK: &[(&str, On)] = &[
    ("dynamodb:CreateTable", On::LeaseTable),
    ("dynamodb:CreateTable", On::WorkerTable),
    ("dynamodb:UpdateTable", On::WorkerTable),
];

/// A worker's source and read mode: what decides the calls it makes.
#[derive(Debug, Clone, Copy)]
struct Case {
    source: SourceKind,
    fanout: bool,
}

/// Every valid combination (DynamoDB Streams has no fan-out).
const CASES: &[Case] = &[
    Case {
        source: SourceKind::Kinesis,
        fanout: false,
    },
    Case {
        source: SourceKind::Kinesis,
        fanout: true,
    },
    Case {
        source: SourceKind::DynamoDbStreams,
        fanout: false,
    },
];

/// The standalone policies, and the worker each is for.
const STANDALONE_POLICIES: &[(&str, Case)] = &[
    ("deploy/iam-policy.json", CASES[0]),
    ("deploy/iam-policy-fanout.json", CASES[1]),
    ("deploy/iam-policy-dynamodb-streams.json", CASES[2]),
];

const STATUS_PORT: u64 = 9797;
const CONFIG_FILE: &str = "/etc/flotilla/flotilla.toml";

// ---- reading files ---------------------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// Every YAML document in a file (`---`-separated).
fn yaml_documents(relative: &str) -> Vec<Value> {
    let text = read(relative);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
        })
        .collect()
}

fn yaml(relative: &str) -> Value {
    let mut docs = yaml_documents(relative);
    assert_eq!(docs.len(), 1, "{relative}: expected one YAML document");
    docs.remove(0)
}

/// The value at `path` (mapping keys, or indices into sequences); panics naming the
/// path and the file's role when it is missing.
fn at<'a>(value: &'a Value, what: &str, path: &[&str]) -> &'a Value {
    let mut here = value;
    for (i, key) in path.iter().enumerate() {
        let next = match here {
            Value::Sequence(items) => key.parse::<usize>().ok().and_then(|n| items.get(n)),
            Value::Mapping(map) => map.get(*key),
            _ => None,
        };
        here = next.unwrap_or_else(|| panic!("{what}: no {}", path[..=i].join(".")));
    }
    here
}

fn text<'a>(value: &'a Value, what: &str, path: &[&str]) -> &'a str {
    at(value, what, path)
        .as_str()
        .unwrap_or_else(|| panic!("{what}: {} is not a string", path.join(".")))
}

fn number(value: &Value, what: &str, path: &[&str]) -> u64 {
    at(value, what, path)
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: {} is not a whole number", path.join(".")))
}

fn flag(value: &Value, what: &str, path: &[&str]) -> bool {
    at(value, what, path)
        .as_bool()
        .unwrap_or_else(|| panic!("{what}: {} is not a boolean", path.join(".")))
}

/// A CloudFormation intrinsic in short form: (`"!Ref"`, its argument).
fn tagged(value: &Value) -> Option<(String, &Value)> {
    match value {
        Value::Tagged(t) => Some((t.tag.to_string(), &t.value)),
        _ => None,
    }
}

// ---- Kubernetes ------------------------------------------------------------------

const K8S: &str = "deploy/kubernetes";

/// The manifests kustomization.yaml lists, by kind (one document per file).
fn manifest(kind: &str) -> Value {
    let kustomization = yaml(&format!("{K8S}/kustomization.yaml"));
    let found: Vec<Value> = at(&kustomization, "kustomization.yaml", &["resources"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|file| yaml(&format!("{K8S}/{}", file.as_str().unwrap())))
        .filter(|doc| doc["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} in {K8S}");
    found.into_iter().next().unwrap()
}

fn container(deployment: &Value) -> &Value {
    let containers = at(
        deployment,
        "Deployment",
        &["spec", "template", "spec", "containers"],
    )
    .as_sequence()
    .unwrap();
    assert_eq!(containers.len(), 1, "the Deployment runs one container");
    &containers[0]
}

/// The settings file the ConfigMap mounts at /etc/flotilla.
fn configmap_toml() -> String {
    text(
        &manifest("ConfigMap"),
        "ConfigMap",
        &["data", "flotilla.toml"],
    )
    .to_owned()
}

/// `overlay`'s keys replace `base`'s, table by table.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// What a pod runs with: config/default.toml with the ConfigMap's file on top (the
/// layering of `flotilla run --config`; the pod sets no other FLOTILLA__ variable
/// than the worker id).
fn pod_settings() -> Settings {
    let mut settings: toml::Table = read("config/default.toml").parse().unwrap();
    let overlay: toml::Table = configmap_toml()
        .parse()
        .unwrap_or_else(|e| panic!("the ConfigMap's flotilla.toml is not TOML: {e}"));
    merge(&mut settings, overlay);
    let settings: Settings = toml::Value::Table(settings)
        .try_into()
        .unwrap_or_else(|e| panic!("the ConfigMap's flotilla.toml: {e}"));
    settings
        .validate()
        .unwrap_or_else(|e| panic!("the ConfigMap's flotilla.toml: {e}"));
    settings
}

#[test]
fn every_kubernetes_manifest_parses_and_the_kustomization_lists_each() {
    let kustomization = yaml(&format!("{K8S}/kustomization.yaml"));
    let listed: BTreeSet<String> = at(&kustomization, "kustomization.yaml", &["resources"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(root().join(K8S)).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        for doc in yaml_documents(&format!("{K8S}/{name}")) {
            for key in ["apiVersion", "kind"] {
                text(&doc, &name, &[key]);
            }
            text(&doc, &name, &["metadata", "name"]);
        }
        on_disk.insert(name);
    }
    assert_eq!(
        listed, on_disk,
        "kustomization.yaml's resources must be the manifests in {K8S}"
    );
    let kinds: BTreeSet<String> = listed
        .iter()
        .map(|f| {
            yaml(&format!("{K8S}/{f}"))["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let expected = [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "ServiceAccount",
    ];
    assert_eq!(kinds, expected.iter().map(|k| k.to_string()).collect());
}

#[test]
fn the_grace_period_covers_the_handoff_and_the_shutdown() {
    let settings = pod_settings();
    let deployment = manifest("Deployment");
    let grace = Duration::from_secs(number(
        &deployment,
        "Deployment",
        &["spec", "template", "spec", "terminationGracePeriodSeconds"],
    ));
    let needed = settings.lease.handoff_timeout + settings.supervision.shutdown_timeout;
    assert!(
        grace > needed,
        "terminationGracePeriodSeconds ({grace:?}) must exceed lease.handoff_timeout ({:?}) \
         + supervision.shutdown_timeout ({:?}) = {needed:?}, or Kubernetes kills a \
         draining worker with its leases held",
        settings.lease.handoff_timeout,
        settings.supervision.shutdown_timeout,
    );
    assert!(
        grace > settings.drain_limit(),
        "terminationGracePeriodSeconds ({grace:?}) must exceed the worker's drain limit ({:?})",
        settings.drain_limit()
    );
}

#[test]
fn the_probes_reach_the_status_endpoint() {
    let deployment = manifest("Deployment");
    let c = container(&deployment);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(text(c, "container", &[probe, "httpGet", "path"]), path);
        assert_eq!(
            number(c, "container", &[probe, "httpGet", "port"]),
            STATUS_PORT,
            "{probe} port"
        );
    }
    let ports: Vec<u64> = at(c, "container", &["ports"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| number(p, "container port", &["containerPort"]))
        .collect();
    assert_eq!(ports, [STATUS_PORT]);

    // The kubelet probes the pod's IP: a loopback listener would never answer.
    let settings = pod_settings();
    assert!(
        settings.status.enabled,
        "the ConfigMap turns the status endpoint off"
    );
    let bind: std::net::SocketAddr = settings.status.bind.parse().unwrap();
    assert!(
        bind.ip().is_unspecified(),
        "status.bind {bind} is not reachable from the kubelet; use 0.0.0.0:{STATUS_PORT}"
    );
    assert_eq!(u64::from(bind.port()), STATUS_PORT);
}

#[test]
fn the_pod_runs_locked_down_as_the_images_user() {
    let deployment = manifest("Deployment");
    let pod = at(&deployment, "Deployment", &["spec", "template", "spec"]);
    let c = container(&deployment);
    assert!(flag(pod, "pod", &["securityContext", "runAsNonRoot"]));
    assert!(flag(c, "container", &["securityContext", "runAsNonRoot"]));
    assert!(flag(
        c,
        "container",
        &["securityContext", "readOnlyRootFilesystem"]
    ));
    assert!(!flag(
        c,
        "container",
        &["securityContext", "allowPrivilegeEscalation"]
    ));
    assert_eq!(
        at(c, "container", &["securityContext", "capabilities", "drop"]),
        &Value::Sequence(vec![Value::from("ALL")])
    );
    let uid = number(pod, "pod", &["securityContext", "runAsUser"]);
    assert_ne!(uid, 0);
    assert_eq!(
        uid.to_string(),
        dockerfile_user().0,
        "the pod's runAsUser and the image's USER differ"
    );
    for kind in ["requests", "limits"] {
        text(c, "container", &["resources", kind, "memory"]);
    }
}

#[test]
fn the_deployment_runs_three_named_workers_on_the_mounted_settings() {
    let deployment = manifest("Deployment");
    assert_eq!(number(&deployment, "Deployment", &["spec", "replicas"]), 3);
    let pod = at(&deployment, "Deployment", &["spec", "template", "spec"]);
    let c = container(&deployment);

    let env = at(c, "container", &["env"]).as_sequence().unwrap();
    let worker_id = env
        .iter()
        .find(|e| e["name"].as_str() == Some("FLOTILLA__WORKER__WORKER_ID"))
        .expect("FLOTILLA__WORKER__WORKER_ID is not set");
    assert_eq!(
        text(
            worker_id,
            "worker id",
            &["valueFrom", "fieldRef", "fieldPath"]
        ),
        "metadata.name"
    );

    let args: Vec<&str> = at(c, "container", &["args"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        dockerfile_cmd(),
        "container args and the image's CMD differ"
    );

    // The ConfigMap is mounted where the command reads it.
    let configmap = manifest("ConfigMap");
    let volume = at(pod, "pod", &["volumes", "0"]);
    assert_eq!(
        text(volume, "volume", &["configMap", "name"]),
        text(&configmap, "ConfigMap", &["metadata", "name"])
    );
    let mount = at(c, "container", &["volumeMounts", "0"]);
    assert_eq!(
        text(mount, "mount", &["name"]),
        text(volume, "volume", &["name"])
    );
    let dir = text(mount, "mount", &["mountPath"]);
    let file = Path::new(CONFIG_FILE);
    assert_eq!(Path::new(dir), file.parent().unwrap());
    text(
        &configmap,
        "ConfigMap",
        &["data", file.file_name().unwrap().to_str().unwrap()],
    );

    let account = manifest("ServiceAccount");
    assert_eq!(
        text(pod, "pod", &["serviceAccountName"]),
        text(&account, "ServiceAccount", &["metadata", "name"])
    );
}

#[test]
fn the_disruption_budget_takes_one_worker_at_a_time() {
    let pdb = manifest("PodDisruptionBudget");
    assert_eq!(
        number(&pdb, "PodDisruptionBudget", &["spec", "maxUnavailable"]),
        1
    );
    let deployment = manifest("Deployment");
    assert_eq!(
        at(&pdb, "PodDisruptionBudget", &["spec", "selector"]),
        at(&deployment, "Deployment", &["spec", "selector"]),
        "the PodDisruptionBudget selects other pods than the Deployment's"
    );
}

#[test]
fn the_service_account_names_an_iam_role() {
    let account = manifest("ServiceAccount");
    let arn = text(
        &account,
        "ServiceAccount",
        &["metadata", "annotations", "eks.amazonaws.com/role-arn"],
    );
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    assert!(
        matches!(parts[..], ["arn", _, "iam", "", account, role]
            if account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit())
                && role.starts_with("role/")),
        "{arn} is not an IAM role ARN"
    );
}

#[test]
fn the_configmap_names_the_stream_application_and_namespace_of_the_stack() {
    let settings = pod_settings();
    assert!(!settings.worker.application.is_empty());
    assert!(
        settings.aws.region.is_some(),
        "the ConfigMap sets no region"
    );
    let template = template();
    assert_eq!(
        settings.metrics.namespace,
        text(
            &template,
            "template",
            &["Parameters", "MetricsNamespace", "Default"]
        ),
        "the workers publish to another namespace than the policy allows by default"
    );

    // worker.stream is what a stack for this source tells the workers to read, and
    // that stack is valid with the ConfigMap's application as its ApplicationName.
    let source = Source::parse(&settings.worker.stream)
        .unwrap_or_else(|e| panic!("the ConfigMap's worker.stream: {e}"));
    let application = settings.worker.application.as_str();
    let stack = match &source {
        Source::Kinesis { stream } => Stack::new(&[
            ("ApplicationName", application),
            ("SourceType", "kinesis"),
            ("StreamName", stream),
        ]),
        Source::Table { table } | Source::TableStream { table, .. } => Stack::new(&[
            ("ApplicationName", application),
            ("SourceType", "dynamodb-streams"),
            ("SourceTable", table),
        ]),
    };
    assert_eq!(stack.refusals(), Vec::<String>::new());
    if !matches!(source, Source::TableStream { .. }) {
        assert_eq!(stack.output("WorkerStream"), settings.worker.stream);
    }
}

// ---- CloudFormation --------------------------------------------------------------

fn template() -> Value {
    yaml("deploy/cloudformation/flotilla.yaml")
}

/// The one resource of a type in the template.
fn resource<'a>(template: &'a Value, kind: &str) -> &'a Value {
    let found: Vec<&Value> = at(template, "template", &["Resources"])
        .as_mapping()
        .unwrap()
        .values()
        .filter(|r| r["Type"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} in the template");
    found[0]
}

/// The resource `name` (its logical id) of the template, which must be of type `kind`.
fn named<'a>(template: &'a Value, name: &str, kind: &str) -> &'a Value {
    let found = at(template, "template", &["Resources", name]);
    assert_eq!(text(found, name, &["Type"]), kind, "{name}'s type");
    found
}

/// The statements in force: a statement may be `!If [CONDITION, S, !Ref AWS::NoValue]`,
/// present when `holds(CONDITION)`.
fn statements<'a>(policy_document: &'a Value, holds: &dyn Fn(&str) -> bool) -> Vec<&'a Value> {
    at(policy_document, "policy", &["Statement"])
        .as_sequence()
        .expect("Statement is not a list")
        .iter()
        .filter_map(|statement| match tagged(statement) {
            Some((tag, args)) if tag == "!If" => {
                let args = args.as_sequence().expect("!If takes a list");
                let condition = args[0].as_str().expect("!If [CONDITION, ...]");
                assert_eq!(
                    tagged(&args[2]).map(|(tag, v)| (tag, v.as_str().map(str::to_owned))),
                    Some(("!Ref".to_owned(), Some("AWS::NoValue".to_owned()))),
                    "{statement:?}"
                );
                holds(condition).then_some(&args[1])
            }
            Some((tag, _)) => panic!("a statement tagged {tag}"),
            None => Some(statement),
        })
        .collect()
}

/// Every statement, whatever the conditions.
fn all_statements(policy_document: &Value) -> Vec<&Value> {
    statements(policy_document, &|_| true)
}

/// A statement's actions: `Action` as one string or a list.
fn actions(statement: &Value) -> Vec<String> {
    assert!(
        statement.get("NotAction").is_none(),
        "NotAction grants everything else"
    );
    match at(statement, "statement", &["Action"]) {
        Value::String(one) => vec![one.clone()],
        Value::Sequence(many) => many
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect(),
        other => panic!("Action is neither a string nor a list: {other:?}"),
    }
}

/// The resources a policy may name, exactly, and what each is: in the template
/// (`!Sub` text, or `!GetAtt LeaseTable.Arn`)... (the two tables' names and the
/// index's are checked against the code by
/// `the_policies_name_the_tables_and_the_index_the_code_uses`)
const TEMPLATE_RESOURCES: &[(&str, On)] = &[
    (
        "arn:${AWS::Partition}:kinesis:${AWS::Region}:${AWS::AccountId}:stream/${StreamName}",
        On::Stream,
    ),
    (
        "arn:${AWS::Partition}:kinesis:${AWS::Region}:${AWS::AccountId}:stream/${StreamName}/consumer/${Consumer}:*",
        On::Consumer,
    ),
    (
        "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${SourceTable}/stream/*",
        On::TableStream,
    ),
    (
        "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${SourceTable}",
        On::SourceTable,
    ),
    ("!GetAtt LeaseTable.Arn", On::LeaseTable),
    ("!GetAtt WorkerTable.Arn", On::WorkerTable),
    (
        "${WorkerTable.Arn}/index/flotilla-heartbeats",
        On::WorkerTableIndex,
    ),
    ("*", On::Anything),
    (
        "arn:${AWS::Partition}:kinesis:${AWS::Region}:${AWS::AccountId}:stream/${DeadLetterStream}",
        On::DeadLetterStream,
    ),
    (
        "arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:${DeadLetterQueue}",
        On::DeadLetterQueue,
    ),
];

/// ...and in the standalone policies (placeholders to replace).
const POLICY_RESOURCES: &[(&str, On)] = &[
    (
        "arn:aws:kinesis:${Region}:${AccountId}:stream/${StreamName}",
        On::Stream,
    ),
    (
        "arn:aws:kinesis:${Region}:${AccountId}:stream/${StreamName}/consumer/${ConsumerName}:*",
        On::Consumer,
    ),
    (
        "arn:aws:dynamodb:${Region}:${AccountId}:table/${SourceTable}/stream/*",
        On::TableStream,
    ),
    (
        "arn:aws:dynamodb:${Region}:${AccountId}:table/${SourceTable}",
        On::SourceTable,
    ),
    (
        "arn:aws:dynamodb:${Region}:${AccountId}:table/${ApplicationName}",
        On::LeaseTable,
    ),
    (
        "arn:aws:dynamodb:${Region}:${AccountId}:table/${ApplicationName}-FlotillaWorkers",
        On::WorkerTable,
    ),
    (
        "arn:aws:dynamodb:${Region}:${AccountId}:table/${ApplicationName}-FlotillaWorkers/index/flotilla-heartbeats",
        On::WorkerTableIndex,
    ),
    ("*", On::Anything),
    (
        "arn:aws:kinesis:${Region}:${AccountId}:stream/${DeadLetterStream}",
        On::DeadLetterStream,
    ),
    (
        "arn:aws:sqs:${Region}:${AccountId}:${DeadLetterQueue}",
        On::DeadLetterQueue,
    ),
];

/// A statement's one `Resource` as text: a string, the text of a `!Sub` (its first
/// argument in the list form), or `!GetAtt X`.
fn resource_text(statement: &Value) -> String {
    let resource = at(statement, "statement", &["Resource"]);
    match tagged(resource) {
        None => resource
            .as_str()
            .unwrap_or_else(|| panic!("Resource {resource:?} is not one string"))
            .to_owned(),
        Some((tag, arg)) => match (tag.as_str(), arg) {
            ("!Sub", Value::String(text)) => text.clone(),
            ("!Sub", Value::Sequence(args)) => args[0].as_str().unwrap().to_owned(),
            ("!GetAtt", Value::String(attribute)) => format!("!GetAtt {attribute}"),
            _ => panic!("Resource {resource:?}: no rule for {tag} in this test"),
        },
    }
}

/// Every action the statements allow, each with what it is on; refuses wildcard
/// actions, Deny statements (whose arithmetic this test does not do), a resource that
/// is none of `resources`, and an action granted twice on one resource.
fn granted(statements: &[&Value], resources: &[(&str, On)]) -> BTreeSet<Permission> {
    try_granted(statements, resources).unwrap_or_else(|refusal| panic!("{refusal}"))
}

/// [`granted`], with what it refuses as an error.
fn try_granted(
    statements: &[&Value],
    resources: &[(&str, On)],
) -> Result<BTreeSet<Permission>, String> {
    let mut all = BTreeSet::new();
    for statement in statements {
        let effect = text(statement, "statement", &["Effect"]);
        if effect != "Allow" {
            return Err(format!(
                "Effect {effect}: only Allow statements are checked"
            ));
        }
        let resource = resource_text(statement);
        let on = resources
            .iter()
            .find(|(known, _)| *known == resource)
            .map(|(_, on)| *on)
            .ok_or_else(|| format!("Resource {resource}: not a resource a worker uses"))?;
        for action in actions(statement) {
            if action.contains('*') {
                return Err(format!("{action}: a wildcard is not least privilege"));
            }
            if !all.insert((action.clone(), on)) {
                return Err(format!("{action} is granted twice on {resource}"));
            }
        }
    }
    Ok(all)
}

/// The statement that grants `action` (the first, whatever the conditions).
fn statement_for<'a>(policy_document: &'a Value, action: &str) -> &'a Value {
    all_statements(policy_document)
        .into_iter()
        .find(|s| actions(s).iter().any(|a| a == action))
        .unwrap_or_else(|| panic!("no statement grants {action}"))
}

fn worker_policy(template: &Value) -> &Value {
    at(
        resource(template, "AWS::IAM::ManagedPolicy"),
        "WorkerPolicy",
        &["Properties", "PolicyDocument"],
    )
}

/// The template for some parameters (the others at their defaults): its conditions,
/// rules, policy statements and outputs, evaluated as CloudFormation would, for the
/// intrinsics the template uses (`!Ref` of a parameter, `!Sub`, `!If`, `!Equals`,
/// `!Not`, `!And`, `!Or`, `!Condition`); anything else panics.
struct Stack {
    template: Value,
    parameters: BTreeMap<String, String>,
}

impl Stack {
    fn new(given: &[(&str, &str)]) -> Self {
        let template = template();
        let declared = at(&template, "template", &["Parameters"])
            .as_mapping()
            .unwrap();
        let mut parameters = BTreeMap::new();
        for (name, parameter) in declared {
            if let Some(default) = parameter.get("Default") {
                let default = match default {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    other => panic!("{name:?}: Default {other:?}"),
                };
                parameters.insert(name.as_str().unwrap().to_owned(), default);
            }
        }
        for (name, value) in given {
            let parameter = declared
                .get(*name)
                .unwrap_or_else(|| panic!("the template has no parameter {name}"));
            if let Some(allowed) = parameter.get("AllowedValues") {
                assert!(
                    allowed
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .any(|a| a.as_str() == Some(value)),
                    "{name}={value} is not among its AllowedValues"
                );
            }
            parameters.insert((*name).to_owned(), (*value).to_owned());
        }
        Self {
            template,
            parameters,
        }
    }

    /// The stack of a worker case, for the application orders-billing.
    fn of(case: Case) -> Self {
        Self::of_with(case, &[])
    }

    /// [`Stack::of`], with more parameters.
    fn of_with(case: Case, more: &[(&str, &str)]) -> Self {
        let mode = if case.fanout { "fanout" } else { "polling" };
        let (source_parameter, source) = match case.source {
            SourceKind::Kinesis => ("StreamName", "orders"),
            SourceKind::DynamoDbStreams => ("SourceTable", "orders"),
        };
        let mut parameters = vec![
            ("ApplicationName", "orders-billing"),
            ("SourceType", case.source.as_str()),
            (source_parameter, source),
            ("ReadMode", mode),
        ];
        parameters.extend_from_slice(more);
        Self::new(&parameters)
    }

    fn parameter(&self, name: &str) -> &str {
        self.parameters
            .get(name)
            .unwrap_or_else(|| panic!("parameter {name} has no value and no default"))
    }

    /// A text value. `${AWS::...}` pseudo parameters are left as they are.
    fn value(&self, value: &Value) -> String {
        let Some((tag, arg)) = tagged(value) else {
            return value
                .as_str()
                .unwrap_or_else(|| panic!("{value:?} is not text"))
                .to_owned();
        };
        match (tag.as_str(), arg) {
            ("!Ref", Value::String(name)) => self.parameter(name).to_owned(),
            ("!Sub", Value::String(text)) => self.substitute(text, &BTreeMap::new()),
            ("!Sub", Value::Sequence(args)) => {
                let variables = args[1]
                    .as_mapping()
                    .unwrap()
                    .iter()
                    .map(|(name, v)| (name.as_str().unwrap().to_owned(), self.value(v)))
                    .collect();
                self.substitute(args[0].as_str().unwrap(), &variables)
            }
            ("!If", Value::Sequence(args)) => {
                let condition = args[0].as_str().unwrap();
                self.value(&args[if self.condition(condition) { 1 } else { 2 }])
            }
            _ => panic!("{tag} {arg:?}: no rule for it in this test"),
        }
    }

    fn substitute(&self, text: &str, variables: &BTreeMap<String, String>) -> String {
        let mut out = text.to_owned();
        for (name, value) in variables.iter().chain(&self.parameters) {
            out = out.replace(&format!("${{{name}}}"), value);
        }
        out
    }

    fn holds(&self, value: &Value) -> bool {
        let (tag, arg) = tagged(value).unwrap_or_else(|| panic!("{value:?} is no condition"));
        let args = || arg.as_sequence().unwrap();
        match tag.as_str() {
            "!Equals" => self.value(&args()[0]) == self.value(&args()[1]),
            "!Not" => !self.holds(&args()[0]),
            "!And" => args().iter().all(|c| self.holds(c)),
            "!Or" => args().iter().any(|c| self.holds(c)),
            "!Condition" => self.condition(arg.as_str().unwrap()),
            _ => panic!("{tag}: no rule for it in this test"),
        }
    }

    fn condition(&self, name: &str) -> bool {
        self.holds(at(&self.template, "template", &["Conditions", name]))
    }

    /// The descriptions of the rules' assertions these parameters fail: CloudFormation
    /// refuses the stack unless there are none.
    fn refusals(&self) -> Vec<String> {
        let mut refused = Vec::new();
        let Some(rules) = self.template.get("Rules") else {
            return refused;
        };
        for (name, rule) in rules.as_mapping().unwrap() {
            if rule
                .get("RuleCondition")
                .is_some_and(|condition| !self.holds(condition))
            {
                continue;
            }
            let what = format!("rule {}", name.as_str().unwrap());
            for assertion in at(rule, &what, &["Assertions"]).as_sequence().unwrap() {
                if !self.holds(at(assertion, &what, &["Assert"])) {
                    refused.push(text(assertion, &what, &["AssertDescription"]).to_owned());
                }
            }
        }
        refused
    }

    /// The worker policy's document, to change for a test of the checks.
    fn policy_mut(&mut self) -> &mut Value {
        &mut self.template["Resources"]["WorkerPolicy"]["Properties"]["PolicyDocument"]
    }

    /// The worker policy's statements in force.
    fn statements(&self) -> Vec<&Value> {
        statements(worker_policy(&self.template), &|c| self.condition(c))
    }

    fn output(&self, name: &str) -> String {
        self.value(at(&self.template, "template", &["Outputs", name, "Value"]))
    }
}

#[test]
fn the_template_declares_its_parameters_and_outputs() {
    let template = template();
    for name in [
        "ApplicationName",
        "SourceType",
        "StreamName",
        "SourceTable",
        "CreateStream",
        "ShardCount",
        "MetricsNamespace",
        "DeadLetterStream",
        "DeadLetterQueue",
    ] {
        text(&template, "template", &["Parameters", name, "Type"]);
    }
    for (name, default) in [("CreateStream", "false"), ("SourceType", "kinesis")] {
        assert_eq!(
            text(&template, "template", &["Parameters", name, "Default"]),
            default
        );
    }
    for output in [
        "LeaseTableName",
        "LeaseTableArn",
        "WorkerTableName",
        "WorkerTableArn",
        "StreamArn",
        "WorkerStream",
        "WorkerPolicyArn",
        "FailureDestination",
    ] {
        at(&template, "template", &["Outputs", output, "Value"]);
    }
    // The stream is made only on request.
    let stream = resource(&template, "AWS::Kinesis::Stream");
    let condition = text(stream, "Stream", &["Condition"]);
    at(&template, "template", &["Conditions", condition]);
}

/// A table of the template: on demand, keyed by `leaseKey` alone, kept when the stack
/// goes and protected from deletion; its attribute definitions as (name, type).
fn keyed_by_lease_key(table: &Value, what: &str) -> Vec<(String, String)> {
    assert_eq!(
        text(table, what, &["DeletionPolicy"]),
        "Retain",
        "{what} must outlive the stack"
    );
    assert_eq!(text(table, what, &["UpdateReplacePolicy"]), "Retain");
    let properties = at(table, what, &["Properties"]);
    assert_eq!(text(properties, what, &["BillingMode"]), "PAY_PER_REQUEST");
    assert!(flag(properties, what, &["DeletionProtectionEnabled"]));
    let key = at(properties, what, &["KeySchema"]).as_sequence().unwrap();
    assert_eq!(key.len(), 1, "{what} has a hash key only");
    assert_eq!(
        text(&key[0], "KeySchema", &["AttributeName"]),
        attr::LEASE_KEY
    );
    assert_eq!(text(&key[0], "KeySchema", &["KeyType"]), "HASH");
    at(properties, what, &["AttributeDefinitions"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| {
            (
                text(a, "AttributeDefinitions", &["AttributeName"]).to_owned(),
                text(a, "AttributeDefinitions", &["AttributeType"]).to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_template_makes_the_lease_table_and_the_worker_table() {
    let template = template();
    let tables: BTreeSet<&str> = at(&template, "template", &["Resources"])
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"].as_str() == Some("AWS::DynamoDB::Table"))
        .map(|(name, _)| name.as_str().unwrap())
        .collect();
    assert_eq!(tables, ["LeaseTable", "WorkerTable"].into());
}

#[test]
fn the_lease_table_is_on_demand_keyed_by_lease_key_protected_and_holds_no_index() {
    let template = template();
    let resource = named(&template, "LeaseTable", "AWS::DynamoDB::Table");
    let table = at(resource, "LeaseTable", &["Properties"]);
    let name = tagged(at(table, "LeaseTable", &["TableName"]));
    assert_eq!(
        name.map(|(tag, arg)| (tag, arg.as_str().unwrap().to_owned())),
        Some(("!Ref".to_owned(), "ApplicationName".to_owned())),
        "the table must be named after the application"
    );
    // The KCL 2.x shape: the key and nothing else. The heartbeat index is the worker
    // table's: the lease table holds no row it would index.
    assert_eq!(
        keyed_by_lease_key(resource, "LeaseTable"),
        [(attr::LEASE_KEY.to_owned(), "S".to_owned())]
    );
    for index in ["GlobalSecondaryIndexes", "LocalSecondaryIndexes"] {
        assert!(
            table.get(index).is_none(),
            "the lease table has {index}: flotilla's heartbeat index is on the worker table"
        );
    }
    assert!(flag(
        table,
        "LeaseTable",
        &[
            "PointInTimeRecoverySpecification",
            "PointInTimeRecoveryEnabled"
        ]
    ));
}

#[test]
fn the_worker_table_is_named_as_the_workers_derive_it_and_has_the_heartbeat_index() {
    let template = template();
    let resource = named(&template, "WorkerTable", "AWS::DynamoDB::Table");
    let table = at(resource, "WorkerTable", &["Properties"]);
    let name = tagged(at(table, "WorkerTable", &["TableName"]));
    assert_eq!(
        name.map(|(tag, arg)| (tag, arg.as_str().unwrap().to_owned())),
        Some(("!Sub".to_owned(), worker_table_name("${ApplicationName}"))),
        "the worker table must be named as layout::worker_table_name names it"
    );
    let stack = Stack::of(CASES[0]);
    assert_eq!(
        stack.value(at(table, "WorkerTable", &["TableName"])),
        worker_table_name(stack.parameter("ApplicationName"))
    );
    assert_eq!(
        keyed_by_lease_key(resource, "WorkerTable"),
        [
            (attr::LEASE_KEY.to_owned(), "S".to_owned()),
            (attr::HEARTBEAT_INDEX_KEY.to_owned(), "S".to_owned())
        ]
    );
    // The heartbeat index, as `ensure_table` makes it: sparse (keyed by an attribute
    // only heartbeat rows carry), projecting only what a round reads.
    let indexes = at(table, "WorkerTable", &["GlobalSecondaryIndexes"])
        .as_sequence()
        .unwrap();
    assert_eq!(indexes.len(), 1);
    let index = &indexes[0];
    assert_eq!(text(index, "index", &["IndexName"]), HEARTBEAT_INDEX);
    let index_key = at(index, "index", &["KeySchema"]).as_sequence().unwrap();
    assert_eq!(index_key.len(), 1);
    assert_eq!(
        text(&index_key[0], "KeySchema", &["AttributeName"]),
        attr::HEARTBEAT_INDEX_KEY
    );
    assert_eq!(text(&index_key[0], "KeySchema", &["KeyType"]), "HASH");
    assert_eq!(
        text(index, "index", &["Projection", "ProjectionType"]),
        "INCLUDE"
    );
    let projected: Vec<&str> = at(index, "index", &["Projection", "NonKeyAttributes"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(projected, HEARTBEAT_INDEX_PROJECTION);

    // Every application name the template accepts leaves the worker table's name
    // within DynamoDB's 255 characters.
    let pattern = text(
        &template,
        "template",
        &["Parameters", "ApplicationName", "AllowedPattern"],
    );
    let longest: usize = pattern
        .rsplit_once(',')
        .and_then(|(_, max)| max.strip_suffix('}'))
        .and_then(|max| max.parse().ok())
        .unwrap_or_else(|| panic!("ApplicationName's AllowedPattern {pattern}: no {{MIN,MAX}}"));
    assert!(
        longest + WORKER_TABLE_SUFFIX.len() <= 255,
        "ApplicationName may be {longest} long: its worker table's name would exceed 255"
    );
}

#[test]
fn put_metric_data_is_fenced_by_the_namespace_parameter() {
    let template = template();
    let statement = statement_for(worker_policy(&template), "cloudwatch:PutMetricData");
    assert_eq!(
        actions(statement),
        ["cloudwatch:PutMetricData"],
        "PutMetricData's statement (Resource \"*\") must grant nothing else"
    );
    assert_eq!(text(statement, "statement", &["Resource"]), "*");
    let namespace = at(
        statement,
        "PutMetricData statement",
        &["Condition", "StringEquals", "cloudwatch:namespace"],
    );
    assert_eq!(
        tagged(namespace).map(|(tag, arg)| (tag, arg.as_str().unwrap().to_owned())),
        Some(("!Ref".to_owned(), "MetricsNamespace".to_owned()))
    );
}

// ---- IAM actions against the code -------------------------------------------------

/// The SDK operations `source` calls: each of `clients` followed, across whitespace and
/// line breaks, by `.operation(`. A client is a whole word (`"client"`: `self.client`,
/// or a `client` variable), or, written with a leading dot, a field only (`".streams"`:
/// `self.streams`, `self` and `.streams` possibly on two lines; not a `streams`
/// variable, such as the config builder dynamodb_streams.rs names so). Whole-line
/// comments and the `#[cfg(test)]` module are not production calls.
///
/// A builder may be sent later (`let request = self.client.list_shards()...;
/// request.send()`), so the scan does not look for `.send()`: every method on an SDK
/// client but `config` is an operation.
fn sdk_operations(source: &str, clients: &[&str]) -> BTreeSet<String> {
    let production = source.split("#[cfg(test)]").next().unwrap();
    let code: String = production
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = BTreeSet::new();
    for client in clients {
        for (start, _) in code.match_indices(client) {
            let field = client.starts_with('.');
            if !field && code[..start].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let rest = &code[start + client.len()..];
            let Some(call) = rest.trim_start().strip_prefix('.') else {
                continue;
            };
            let name: String = call.chars().take_while(|&c| is_ident(c)).collect();
            if call[name.len()..].starts_with('(') && name != "config" {
                found.insert(name);
            }
        }
    }
    found
}

/// `put_metric_data` -> `PutMetricData`.
fn action_name(operation: &str) -> String {
    operation
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The IAM actions an SDK operation needs. IAM has no action for a transaction: each
/// of its items is authorized as its own action, and flotilla's one transaction (the
/// take of an expired lease) is an Update and a ConditionCheck. Nor for SQS's batch
/// calls: SendMessageBatch is authorized as SendMessage.
fn iam_actions(operation: &str) -> Vec<String> {
    match operation {
        "transact_write_items" => vec!["UpdateItem".into(), "ConditionCheckItem".into()],
        "send_message_batch" => vec!["SendMessage".into()],
        _ => vec![action_name(operation)],
    }
}

fn difference<T: Ord + Clone>(a: &BTreeSet<T>, b: &BTreeSet<T>) -> Vec<T> {
    a.difference(b).cloned().collect()
}

/// What a worker of `case` calls, on what: the actions the adapters it uses declare,
/// less the ones no worker makes (and, for a polling worker, the fan-out calls).
fn worker_permissions(case: Case) -> BTreeSet<Permission> {
    let mut needed = BTreeSet::new();
    for adapter in ADAPTERS.iter().filter(|a| a.sources.contains(&case.source)) {
        for action in adapter.declared {
            if adapter.never_granted.contains(action)
                || (!case.fanout && FANOUT_ONLY.contains(action))
            {
                continue;
            }
            for on in (adapter.on)(action) {
                needed.insert((action.to_string(), *on));
            }
        }
    }
    needed
}

/// What the stack's policy grants a worker of `case`: [`worker_permissions`] less what
/// the stack makes itself ([`MADE_BY_THE_STACK`]).
fn stack_worker_permissions(case: Case) -> BTreeSet<Permission> {
    let mut needed = worker_permissions(case);
    for (action, on) in MADE_BY_THE_STACK {
        assert!(
            needed.remove(&(action.to_string(), *on)),
            "{action} on {on:?} is listed as made by the stack, but no worker calls it there"
        );
    }
    needed
}

/// The policy is `needed`, or the message says what differs.
fn assert_grants_exactly(
    what: &str,
    granted: &BTreeSet<Permission>,
    needed: &BTreeSet<Permission>,
) {
    assert!(
        granted == needed,
        "{what} is not what the adapters call.\n  \
         called but not granted (workers will get AccessDenied): {:?}\n  \
         granted but never called (not least privilege): {:?}",
        difference(needed, granted),
        difference(granted, needed),
    );
}

#[test]
fn the_call_scanner_finds_chained_and_later_sent_calls_and_skips_comments() {
    let source = r#"
        let page = self.client.scan().send().await;
        let mut request = self
            .client
            .list_shards()
            .stream_name(stream);
        request.send().await;
        client.put_item().send().await;
        // self.client.delete_table().send()
        let c = aws_sdk_kinesis::Client::from_conf(config);
        self.client_endpoint.get_item();
        self.client.config();
        self.streams.get_records().send().await;
        let described = self
            .tables
            .describe_table();
        self.my_tables.delete_item();
        streams = streams.endpoint_url(url);
        #[cfg(test)]
        mod tests { fn f() { self.client.delete_stream(); } }
    "#;
    let found: Vec<String> = sdk_operations(source, &["client"]).into_iter().collect();
    assert_eq!(found, ["list_shards", "put_item", "scan"]);
    // Clients as fields: not the config builder variables of the same names.
    let found: Vec<String> = sdk_operations(source, &[".streams", ".tables"])
        .into_iter()
        .collect();
    assert_eq!(found, ["describe_table", "get_records"]);
    assert_eq!(
        action_name("describe_stream_summary"),
        "DescribeStreamSummary"
    );
    assert_eq!(action_name("put_metric_data"), "PutMetricData");
}

#[test]
fn each_adapters_iam_actions_are_the_sdk_calls_in_its_source() {
    let files: BTreeSet<String> = std::fs::read_dir(root().join("actors/src/backend/aws"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "mod.rs")
        .collect();
    let listed: BTreeSet<String> = ADAPTERS.iter().map(|a| a.file.to_owned()).collect();
    assert_eq!(
        files, listed,
        "an adapter in actors/src/backend/aws is not checked"
    );
    for adapter in ADAPTERS {
        let path = format!("actors/src/backend/aws/{}", adapter.file);
        let called: BTreeSet<String> = sdk_operations(&read(&path), adapter.clients)
            .iter()
            .flat_map(|op| iam_actions(op))
            .map(|action| format!("{}:{action}", adapter.service))
            .collect();
        let declared: BTreeSet<String> = adapter.declared.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            adapter.declared.len(),
            declared.len(),
            "{path}: IAM_ACTIONS lists an action twice"
        );
        assert!(
            !called.is_empty(),
            "{path}: found no SDK call; is the scan broken?"
        );
        // What the file calls is what IAM_ACTIONS declares, and the calls no worker
        // makes that it leaves out (dynamodb_streams.rs's TableStreamAdmin).
        let accounted: BTreeSet<String> = declared
            .iter()
            .cloned()
            .chain(adapter.never_granted.iter().map(|a| a.to_string()))
            .collect();
        assert!(
            called == accounted,
            "{path}: IAM_ACTIONS (and the calls tests/deploy.rs says no worker makes) do not \
             match the SDK calls in the file.\n  \
             called but not accounted for: {:?}\n  \
             accounted for but not called (drop it from IAM_ACTIONS or tests/deploy.rs): {:?}",
            difference(&called, &accounted),
            difference(&accounted, &called),
        );
    }
    for action in FANOUT_ONLY {
        assert!(
            KINESIS_IAM_ACTIONS.contains(action),
            "{action} is listed as fan-out only, but the Kinesis adapter does not call it"
        );
    }
}

#[test]
fn a_table_stream_worker_makes_no_kinesis_call_and_a_kinesis_worker_no_streams_call() {
    for case in CASES {
        let services: BTreeSet<On> = worker_permissions(*case)
            .into_iter()
            .map(|(_, on)| on)
            .collect();
        let expected: BTreeSet<On> = match (case.source, case.fanout) {
            (SourceKind::Kinesis, false) => [
                On::Stream,
                On::LeaseTable,
                On::WorkerTable,
                On::WorkerTableIndex,
                On::Anything,
            ]
            .into(),
            (SourceKind::Kinesis, true) => [
                On::Stream,
                On::Consumer,
                On::LeaseTable,
                On::WorkerTable,
                On::WorkerTableIndex,
                On::Anything,
            ]
            .into(),
            (SourceKind::DynamoDbStreams, _) => [
                On::TableStream,
                On::SourceTable,
                On::LeaseTable,
                On::WorkerTable,
                On::WorkerTableIndex,
                On::Anything,
            ]
            .into(),
        };
        assert_eq!(services, expected, "{case:?}");
    }
    // The stream calls of a table-stream worker, on the stream; DescribeTable on the
    // table (for dynamodb:TABLE).
    let table: BTreeSet<Permission> = worker_permissions(CASES[2])
        .into_iter()
        .filter(|(_, on)| matches!(on, On::TableStream | On::SourceTable))
        .collect();
    let expected: BTreeSet<Permission> = [
        ("dynamodb:DescribeStream", On::TableStream),
        ("dynamodb:GetShardIterator", On::TableStream),
        ("dynamodb:GetRecords", On::TableStream),
        ("dynamodb:DescribeTable", On::SourceTable),
    ]
    .into_iter()
    .map(|(a, on)| (a.to_owned(), on))
    .collect();
    assert_eq!(table, expected);
}

#[test]
fn the_stacks_policy_grants_exactly_what_a_worker_calls() {
    for case in CASES {
        let stack = Stack::of(*case);
        assert_eq!(stack.refusals(), Vec::<String>::new(), "{case:?}");
        let granted = granted(&stack.statements(), TEMPLATE_RESOURCES);
        assert_grants_exactly(
            &format!("deploy/cloudformation/flotilla.yaml's WorkerPolicy ({case:?})"),
            &granted,
            &stack_worker_permissions(*case),
        );
    }
    // The source types are the ones the code names.
    let template = template();
    let allowed: Vec<&str> = at(
        &template,
        "template",
        &["Parameters", "SourceType", "AllowedValues"],
    )
    .as_sequence()
    .unwrap()
    .iter()
    .map(|v| v.as_str().unwrap())
    .collect();
    assert_eq!(
        allowed,
        EVERY_SOURCE.iter().map(|s| s.as_str()).collect::<Vec<_>>()
    );
    text(&template, "template", &["Parameters", "ReadMode", "Type"]);
}

#[test]
fn the_stack_refuses_a_source_without_its_name_and_kinesis_options_for_a_table() {
    let table = [
        ("ApplicationName", "orders-audit"),
        ("SourceType", "dynamodb-streams"),
        ("SourceTable", "orders"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut parameters = table.to_vec();
        parameters.extend_from_slice(extra);
        Stack::new(&parameters).refusals()
    };
    assert_eq!(with(&[]), Vec::<String>::new());
    for bad in [
        &[("SourceTable", "")][..],
        &[("SourceTable", "orders-audit")],
        &[("SourceTable", worker_table_name("orders-audit").leak())],
        &[("ReadMode", "fanout")],
        &[("CreateStream", "true")],
    ] {
        assert_eq!(with(bad).len(), 1, "{bad:?} is not refused (alone)");
    }
    // Kinesis, the default source, still needs its stream's name.
    let refused = Stack::new(&[("ApplicationName", "orders-billing")]).refusals();
    assert_eq!(
        refused.len(),
        1,
        "a Kinesis stack without StreamName: {refused:?}"
    );
    // And a Kinesis stack never reads a table: SourceTable is ignored.
    let stack = Stack::new(&[
        ("ApplicationName", "orders-billing"),
        ("StreamName", "orders"),
        ("SourceTable", "orders"),
    ]);
    assert_eq!(stack.refusals(), Vec::<String>::new());
    assert!(
        granted(&stack.statements(), TEMPLATE_RESOURCES)
            .iter()
            .all(|(_, on)| !matches!(on, On::TableStream | On::SourceTable))
    );
}

#[test]
fn the_stack_tells_the_workers_what_to_read() {
    for case in CASES {
        let stack = Stack::of(*case);
        let worker_stream = stack.output("WorkerStream");
        let source = Source::parse(&worker_stream)
            .unwrap_or_else(|e| panic!("{case:?}: WorkerStream {worker_stream}: {e}"));
        assert_eq!(source.kind(), case.source, "{case:?}: {worker_stream}");
        match case.source {
            SourceKind::Kinesis => {
                assert_eq!(worker_stream, stack.parameter("StreamName"));
                assert!(stack.output("StreamArn").ends_with(":stream/orders"));
            }
            SourceKind::DynamoDbStreams => {
                assert_eq!(source.table(), Some(stack.parameter("SourceTable")));
                assert!(
                    stack
                        .output("StreamArn")
                        .ends_with(":table/orders/stream/*")
                );
            }
        }
    }
    // A fan-out worker's consumer: reader.consumer_name, by default the application.
    for (consumer, expected) in [("", "orders-billing"), ("billing-efo", "billing-efo")] {
        let stack = Stack::new(&[
            ("ApplicationName", "orders-billing"),
            ("StreamName", "orders"),
            ("ReadMode", "fanout"),
            ("ConsumerName", consumer),
        ]);
        let statements = stack.statements();
        let subscribe = statements
            .iter()
            .find(|s| actions(s).iter().any(|a| a == "kinesis:SubscribeToShard"))
            .unwrap();
        let arn = stack.value(at(subscribe, "SubscribeToShard", &["Resource"]));
        assert!(
            arn.ends_with(&format!(":stream/orders/consumer/{expected}:*")),
            "{arn}"
        );
    }
}

#[test]
fn the_standalone_policies_grant_exactly_what_a_worker_calls() {
    for (file, case) in STANDALONE_POLICIES {
        let policy = yaml(file);
        let granted = granted(
            &statements(&policy, &|c| panic!("{file}: a condition {c}")),
            POLICY_RESOURCES,
        );
        assert_grants_exactly(
            &format!("{file} ({case:?})"),
            &granted,
            &worker_permissions(*case),
        );
        let statement = statement_for(&policy, "cloudwatch:PutMetricData");
        at(
            statement,
            "PutMetricData statement",
            &["Condition", "StringEquals", "cloudwatch:namespace"],
        );
    }
}

#[test]
fn the_lease_adapters_table_split_covers_exactly_the_calls_a_worker_makes() {
    let adapter = ADAPTERS.iter().find(|a| a.file == "dynamodb.rs").unwrap();
    let granted: Vec<&str> = adapter
        .declared
        .iter()
        .copied()
        .filter(|action| !adapter.never_granted.contains(action))
        .collect();
    let split: Vec<&str> = LEASE_ADAPTER_TABLES.iter().map(|(a, _)| *a).collect();
    assert_eq!(
        split.iter().collect::<BTreeSet<_>>().len(),
        split.len(),
        "LEASE_ADAPTER_TABLES lists an action twice"
    );
    assert_eq!(
        split.iter().collect::<BTreeSet<_>>(),
        granted.iter().collect::<BTreeSet<_>>(),
        "LEASE_ADAPTER_TABLES must name the tables of exactly dynamodb.rs's IAM_ACTIONS \
         (less what no worker makes)"
    );
    for (action, on) in LEASE_ADAPTER_TABLES {
        assert!(!on.is_empty(), "{action} is on no table");
        assert!(
            on.iter()
                .all(|on| matches!(on, On::LeaseTable | On::WorkerTable | On::WorkerTableIndex)),
            "{action}: the lease adapter acts on its two tables and the index only"
        );
    }
}

#[test]
fn the_policies_name_the_tables_and_the_index_the_code_uses() {
    let table = |name: &str| format!("arn:aws:dynamodb:${{Region}}:${{AccountId}}:table/{name}");
    let workers = worker_table_name("${ApplicationName}");
    let expected = [
        (table("${ApplicationName}"), On::LeaseTable),
        (table(&workers), On::WorkerTable),
        (
            format!("{}/index/{HEARTBEAT_INDEX}", table(&workers)),
            On::WorkerTableIndex,
        ),
    ];
    for (arn, on) in &expected {
        assert!(
            POLICY_RESOURCES.contains(&(arn.as_str(), *on)),
            "POLICY_RESOURCES does not know {arn} as {on:?}"
        );
    }
    assert!(TEMPLATE_RESOURCES.contains(&(
        format!("${{WorkerTable.Arn}}/index/{HEARTBEAT_INDEX}").as_str(),
        On::WorkerTableIndex
    )));
}

/// The statement of a policy document with this `Sid`.
fn statement_mut<'a>(policy_document: &'a mut Value, sid: &str) -> &'a mut Value {
    policy_document["Statement"]
        .as_sequence_mut()
        .expect("Statement is not a list")
        .iter_mut()
        .find(|s| s.get("Sid").and_then(Value::as_str) == Some(sid))
        .unwrap_or_else(|| panic!("no statement {sid}"))
}

/// Drops the statement of a policy document with this `Sid`.
fn drop_statement(policy_document: &mut Value, sid: &str) {
    let all = policy_document["Statement"].as_sequence_mut().unwrap();
    let before = all.len();
    all.retain(|s| s.get("Sid").and_then(Value::as_str) != Some(sid));
    assert_eq!(all.len(), before - 1, "no statement {sid}");
}

/// Sets `key` (Resource or Action) of statement `to` to that of statement `from`.
fn copy_key(policy_document: &mut Value, key: &str, from: &str, to: &str) {
    let value = statement_mut(policy_document, from)[key].clone();
    statement_mut(policy_document, to)[key] = value;
}

/// `from` replaced by `to` in every string of `value`, through tags.
fn replace_text(value: &mut Value, from: &str, to: &str) {
    match value {
        Value::String(text) => *text = text.replace(from, to),
        Value::Sequence(items) => items.iter_mut().for_each(|v| replace_text(v, from, to)),
        Value::Mapping(map) => map.iter_mut().for_each(|(_, v)| replace_text(v, from, to)),
        Value::Tagged(tagged) => replace_text(&mut tagged.value, from, to),
        _ => {}
    }
}

/// A way to get the two tables wrong, applied to a policy document, given the text
/// that names the worker table in it and the text that names the lease table.
type MixUp = fn(&mut Value, &str, &str);

const LEASE: &str = "KeepTheLeaseTable";
const WORKERS: &str = "KeepTheWorkerTable";
const INDEX: &str = "ReadTheHeartbeatIndex";

const MIX_UPS: &[(&str, MixUp)] = &[
    ("the two tables' statements swapped", |doc, _, _| {
        let lease = statement_mut(doc, LEASE)["Resource"].clone();
        copy_key(doc, "Resource", WORKERS, LEASE);
        statement_mut(doc, WORKERS)["Resource"] = lease;
    }),
    (
        "the lease table's statement on the worker table",
        |doc, _, _| copy_key(doc, "Resource", WORKERS, LEASE),
    ),
    (
        "the worker table's statement on the lease table",
        |doc, _, _| copy_key(doc, "Resource", LEASE, WORKERS),
    ),
    (
        "the lease table's actions on the worker table too",
        |doc, _, _| copy_key(doc, "Action", LEASE, WORKERS),
    ),
    (
        "the worker table's actions on the lease table too",
        |doc, _, _| copy_key(doc, "Action", WORKERS, LEASE),
    ),
    ("no statement on the worker table", |doc, _, _| {
        drop_statement(doc, WORKERS)
    }),
    ("nothing on the worker table or its index", |doc, _, _| {
        drop_statement(doc, WORKERS);
        drop_statement(doc, INDEX);
    }),
    (
        "the heartbeat index of the lease table",
        |doc, workers, lease| {
            let resource = &mut statement_mut(doc, INDEX)["Resource"];
            let before = resource.clone();
            replace_text(resource, workers, lease);
            assert_ne!(*resource, before, "{workers} is not in the index's ARN");
        },
    ),
];

/// Whether `statements` pass [`granted`] and grant exactly `needed`.
fn grants_exactly(
    statements: &[&Value],
    resources: &[(&str, On)],
    needed: &BTreeSet<Permission>,
) -> bool {
    try_granted(statements, resources).is_ok_and(|granted| &granted == needed)
}

#[test]
fn a_policy_that_mixes_up_the_tables_or_leaves_out_the_worker_table_fails_the_check() {
    for (file, case) in STANDALONE_POLICIES {
        let needed = worker_permissions(*case);
        let passes = |policy: &Value| {
            grants_exactly(
                &statements(policy, &|c| panic!("{file}: a condition {c}")),
                POLICY_RESOURCES,
                &needed,
            )
        };
        let policy = yaml(file);
        assert!(passes(&policy), "{file} as it is fails the check");
        for (mix_up, change) in MIX_UPS {
            let mut changed = policy.clone();
            change(
                &mut changed,
                "${ApplicationName}-FlotillaWorkers",
                "${ApplicationName}",
            );
            assert!(!passes(&changed), "{file} with {mix_up} passes the check");
        }
    }
    for case in CASES {
        let needed = stack_worker_permissions(*case);
        let passes =
            |stack: &Stack| grants_exactly(&stack.statements(), TEMPLATE_RESOURCES, &needed);
        assert!(
            passes(&Stack::of(*case)),
            "the stack ({case:?}) fails the check"
        );
        for (mix_up, change) in MIX_UPS {
            let mut stack = Stack::of(*case);
            change(stack.policy_mut(), "WorkerTable", "LeaseTable");
            assert!(
                !passes(&stack),
                "the stack's policy ({case:?}) with {mix_up} passes the check"
            );
        }
    }
}

// ---- Dockerfile ------------------------------------------------------------------

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn dockerfile() -> Vec<(String, String)> {
    let text = read("deploy/Dockerfile");
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
                instructions.push((keyword.to_ascii_uppercase(), args.trim().to_owned()));
                current.clear();
            }
        }
    }
    instructions
}

fn dockerfile_all(keyword: &str) -> Vec<String> {
    dockerfile()
        .into_iter()
        .filter(|(k, _)| k == keyword)
        .map(|(_, args)| args)
        .collect()
}

fn dockerfile_last(keyword: &str) -> String {
    dockerfile_all(keyword)
        .pop()
        .unwrap_or_else(|| panic!("deploy/Dockerfile has no {keyword}"))
}

/// The runtime stage's USER as (uid, gid).
fn dockerfile_user() -> (String, String) {
    let user = dockerfile_last("USER");
    let (uid, gid) = user.split_once(':').unwrap_or((&user, ""));
    (uid.to_owned(), gid.to_owned())
}

fn dockerfile_cmd() -> Vec<String> {
    serde_json::from_str(&dockerfile_last("CMD")).expect("CMD is not in exec (JSON) form")
}

#[test]
fn the_image_is_multi_stage_non_root_and_stops_on_sigterm() {
    let from = dockerfile_all("FROM");
    assert!(
        from.len() >= 2,
        "expected a build stage and a runtime stage: {from:?}"
    );

    // The builder uses the toolchain rust-toolchain.toml pins.
    let toolchain: toml::Table = read("rust-toolchain.toml").parse().unwrap();
    let channel = toolchain["toolchain"]["channel"].as_str().unwrap();
    assert!(
        from[0].starts_with(&format!("rust:{channel}")),
        "the builder image {} is not the toolchain of rust-toolchain.toml ({channel})",
        from[0]
    );
    assert!(
        dockerfile_all("RUN")
            .iter()
            .any(|run| run.contains("cargo build --release --locked")),
        "the image must build with --release --locked"
    );

    let (uid, _) = dockerfile_user();
    let uid: u32 = uid
        .parse()
        .expect("USER must be numeric, or Kubernetes' runAsNonRoot cannot check it");
    assert_ne!(uid, 0, "USER is root");

    assert_eq!(dockerfile_last("STOPSIGNAL"), "SIGTERM");
    assert!(
        dockerfile_all("EXPOSE").contains(&STATUS_PORT.to_string()),
        "the status port is not exposed"
    );
    assert_eq!(
        dockerfile_cmd(),
        ["flotilla", "run", "--config", CONFIG_FILE]
    );
}

#[test]
fn the_images_settings_file_listens_beyond_loopback() {
    let file: toml::Table = read("deploy/flotilla.toml").parse().unwrap();
    let settings: Settings = toml::Value::Table(file).try_into().unwrap();
    let bind: std::net::SocketAddr = settings.status.bind.parse().unwrap();
    assert!(
        bind.ip().is_unspecified(),
        "{bind}: unreachable from outside the container"
    );
    assert_eq!(u64::from(bind.port()), STATUS_PORT);
    assert!(
        dockerfile_all("COPY")
            .iter()
            .any(|copy| copy == &format!("deploy/flotilla.toml {CONFIG_FILE}")),
        "the image does not ship deploy/flotilla.toml at {CONFIG_FILE}"
    );
}

// ---- dead-letter destinations -------------------------------------------------------

/// What a worker writing to `writer`'s destination is granted on top of its source's
/// calls: its declared actions, on the destination.
fn dead_letter_permissions(writer: &DeadLetterWriter) -> BTreeSet<Permission> {
    writer
        .declared
        .iter()
        .map(|action| (action.to_string(), writer.on))
        .collect()
}

#[test]
fn each_dead_letter_writers_iam_actions_are_the_calls_in_its_source() {
    // Every destination in actors/src/failure/ but the file one, which makes no AWS call.
    let dead_letter_files: BTreeSet<String> = std::fs::read_dir(root().join("actors/src/failure"))
        .unwrap()
        .map(|e| {
            format!(
                "actors/src/failure/{}",
                e.unwrap().file_name().into_string().unwrap()
            )
        })
        .filter(|path| {
            let source = read(path);
            let production = source.split("#[cfg(test)]").next().unwrap();
            production.contains("impl DeadLetters for") && path != "actors/src/failure/file.rs"
        })
        .collect();
    let listed: BTreeSet<String> = DEAD_LETTER_WRITERS
        .iter()
        .map(|w| w.file.to_owned())
        .collect();
    assert_eq!(
        dead_letter_files, listed,
        "a dead-letter destination that calls AWS is not checked"
    );
    for writer in DEAD_LETTER_WRITERS {
        let called: BTreeSet<String> = sdk_operations(&read(writer.file), writer.clients)
            .iter()
            .flat_map(|op| iam_actions(op))
            .map(|action| format!("{}:{action}", writer.service))
            .collect();
        let declared: BTreeSet<String> = writer.declared.iter().map(|a| a.to_string()).collect();
        assert!(
            !called.is_empty(),
            "{}: found no call; is the scan broken?",
            writer.file
        );
        assert_eq!(
            called, declared,
            "{}: IAM_ACTIONS is not the calls in the file",
            writer.file
        );
        if writer.service == "kinesis" {
            let kinesis = ADAPTERS.iter().find(|a| a.file == "kinesis.rs").unwrap();
            for action in writer.declared {
                assert!(
                    KINESIS_IAM_ACTIONS.contains(action) && kinesis.never_granted.contains(action),
                    "{action}: the Kinesis adapter makes it, and grants it on no source stream"
                );
            }
        }
    }
}

#[test]
fn the_stack_grants_a_dead_letter_destination_exactly_its_writes_and_names_the_setting() {
    for case in CASES {
        for writer in DEAD_LETTER_WRITERS {
            let stack = Stack::of_with(*case, &[(writer.parameter, "orders-dead")]);
            assert_eq!(stack.refusals(), Vec::<String>::new(), "{case:?}");
            let mut needed = stack_worker_permissions(*case);
            needed.extend(dead_letter_permissions(writer));
            assert_grants_exactly(
                &format!("the stack's WorkerPolicy ({case:?}, {})", writer.parameter),
                &granted(&stack.statements(), TEMPLATE_RESOURCES),
                &needed,
            );
            assert!(stack.condition("DeadLettersGiven"));
            let setting = stack.output("FailureDestination");
            let destination: Destination = setting
                .parse()
                .unwrap_or_else(|e| panic!("FailureDestination {setting}: {e}"));
            match (writer.on, &destination) {
                (On::DeadLetterStream, Destination::Kinesis(stream)) => {
                    assert_eq!(stream, "orders-dead")
                }
                (On::DeadLetterQueue, Destination::Sqs(url)) => assert!(
                    url.starts_with("https://sqs.")
                        && url.ends_with("/${AWS::AccountId}/orders-dead"),
                    "{url}"
                ),
                _ => panic!("{}: FailureDestination {setting}", writer.parameter),
            }
        }
        // Without one, nothing of a destination's.
        assert!(!Stack::of(*case).condition("DeadLettersGiven"));
    }
    // One destination, and not the stream read.
    let both = Stack::of_with(
        CASES[0],
        &[("DeadLetterStream", "dead"), ("DeadLetterQueue", "dead")],
    );
    assert_eq!(both.refusals().len(), 1, "{:?}", both.refusals());
    let itself = Stack::of_with(CASES[0], &[("DeadLetterStream", "orders")]);
    assert_eq!(itself.refusals().len(), 1, "{:?}", itself.refusals());
    // A table's workers may dead-letter to a stream of any name.
    let table = Stack::of_with(CASES[2], &[("DeadLetterStream", "orders")]);
    assert_eq!(table.refusals(), Vec::<String>::new());
}

#[test]
fn the_standalone_dead_letter_policies_grant_exactly_the_writes_of_their_destination() {
    for writer in DEAD_LETTER_WRITERS {
        let policy = yaml(writer.policy);
        let granted = granted(
            &statements(&policy, &|c| panic!("{}: a condition {c}", writer.policy)),
            POLICY_RESOURCES,
        );
        assert_grants_exactly(writer.policy, &granted, &dead_letter_permissions(writer));
    }
}

// ---- autoscaling ------------------------------------------------------------------

const AUTOSCALING: &[&str] = &["autoscaling/keda", "autoscaling/hpa"];

/// A CloudWatch metric's `/metrics` family (`RecommendedWorkers` →
/// `flotilla_recommended_workers`), which must be a gauge in the guide's table of
/// families (docs/status-and-metrics.md): that table is checked against the metrics
/// catalog (`prometheus::tests::the_guide_lists_every_family`), so a name found there is
/// one a worker publishes.
fn gauge_family(cloudwatch_name: &str) -> String {
    let mut snake = String::from("flotilla_");
    for (i, c) in cloudwatch_name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    assert_published_gauge(&snake);
    snake
}

fn assert_published_gauge(family: &str) {
    let chapter = read("docs/status-and-metrics.md");
    let row = format!("| `{family}` | gauge |");
    assert!(
        chapter.contains(&row),
        "{family} is not a gauge of docs/status-and-metrics.md's Prometheus table (the \
         metrics catalog)"
    );
}

/// The components' kustomizations: (component, its one resource), each a Component that
/// drops the base's replica count and is not a resource of the base.
fn autoscaler(component: &str) -> Value {
    let what = format!("{component}/kustomization.yaml");
    let kustomization = yaml(&format!("{K8S}/{what}"));
    assert_eq!(text(&kustomization, &what, &["kind"]), "Component");
    let resources = at(&kustomization, &what, &["resources"])
        .as_sequence()
        .unwrap();
    assert_eq!(resources.len(), 1, "{what}: one autoscaler");
    let patch = at(&kustomization, &what, &["patches", "0"]);
    assert_eq!(text(patch, &what, &["target", "kind"]), "Deployment");
    let deployment = manifest("Deployment");
    let name = text(&deployment, "Deployment", &["metadata", "name"]);
    assert_eq!(text(patch, &what, &["target", "name"]), name);
    let ops: Vec<Value> = serde_yaml_ng::from_str(text(patch, &what, &["patch"])).unwrap();
    assert_eq!(text(&ops[0], &what, &["op"]), "remove");
    assert_eq!(text(&ops[0], &what, &["path"]), "/spec/replicas");
    // Not in the base: two autoscalers on one Deployment fight.
    let base = read(&format!("{K8S}/kustomization.yaml"));
    assert!(!base.contains(component), "the base lists {component}");
    let file = resources[0].as_str().unwrap();
    let object = yaml(&format!("{K8S}/{component}/{file}"));
    let target = at(&object, file, &["spec", "scaleTargetRef"]);
    assert_eq!(text(target, file, &["kind"]), "Deployment");
    assert_eq!(text(target, file, &["apiVersion"]), "apps/v1");
    assert_eq!(text(target, file, &["name"]), name, "{file} scales another");
    assert!(
        !deployment["spec"]["replicas"].is_null(),
        "the base keeps its replicas for a fleet without an autoscaler"
    );
    object
}

#[test]
fn the_keda_scaled_object_scales_the_deployment_to_the_fleets_recommendation() {
    let scaled = autoscaler("autoscaling/keda");
    let what = "ScaledObject";
    assert_eq!(text(&scaled, what, &["kind"]), "ScaledObject");
    assert_eq!(text(&scaled, what, &["apiVersion"]), "keda.sh/v1alpha1");
    assert!(number(&scaled, what, &["spec", "minReplicaCount"]) >= 1);
    let trigger = at(&scaled, what, &["spec", "triggers", "0"]);
    assert_eq!(text(trigger, what, &["type"]), "prometheus");
    // AverageValue 1: replicas = the figure.
    assert_eq!(text(trigger, what, &["metricType"]), "AverageValue");
    assert_eq!(text(trigger, what, &["metadata", "threshold"]), "1");
    let family = gauge_family("RecommendedWorkers");
    let application = pod_settings().worker.application;
    assert_eq!(
        text(trigger, what, &["metadata", "query"]),
        format!("max({family}{{application=\"{application}\"}})"),
        "the largest figure over the ConfigMap's application's workers"
    );
}

#[test]
fn the_hpa_scales_the_deployment_on_the_external_metric() {
    let hpa = autoscaler("autoscaling/hpa");
    let what = "HorizontalPodAutoscaler";
    assert_eq!(text(&hpa, what, &["kind"]), what);
    assert_eq!(text(&hpa, what, &["apiVersion"]), "autoscaling/v2");
    assert!(number(&hpa, what, &["spec", "minReplicas"]) >= 1);
    let metric = at(&hpa, what, &["spec", "metrics", "0"]);
    assert_eq!(text(metric, what, &["type"]), "External");
    let family = gauge_family("RecommendedWorkers");
    assert_eq!(text(metric, what, &["external", "metric", "name"]), family);
    assert_eq!(
        text(
            metric,
            what,
            &[
                "external",
                "metric",
                "selector",
                "matchLabels",
                "application"
            ]
        ),
        pod_settings().worker.application
    );
    assert_eq!(
        text(metric, what, &["external", "target", "type"]),
        "AverageValue"
    );
    assert_eq!(
        text(metric, what, &["external", "target", "averageValue"]),
        "1"
    );
    for component in AUTOSCALING {
        assert!(read("deploy/README.md").contains(&format!("kubernetes/{component}")));
    }
}

/// A metric query of the stack (`MetricStat.Metric`): a gauge the workers publish, in
/// the namespace they publish to, under the dimensions of their worker datum
/// (Application, and StreamName = the WorkerStream output: `worker.stream`).
fn assert_worker_metric(template: &Value, query: &Value, what: &str) -> String {
    let metric = at(query, what, &["MetricStat", "Metric"]);
    let name = text(metric, what, &["MetricName"]).to_owned();
    gauge_family(&name);
    let (tag, arg) = tagged(at(metric, what, &["Namespace"])).unwrap();
    assert_eq!(
        (tag.as_str(), arg.as_str()),
        ("!Ref", Some("MetricsNamespace"))
    );
    let dims = at(metric, what, &["Dimensions"]).as_sequence().unwrap();
    let named: Vec<&str> = dims.iter().map(|d| text(d, what, &["Name"])).collect();
    assert_eq!(named, ["Application", "StreamName"], "{what}: {name}");
    let (tag, arg) = tagged(&dims[0]["Value"]).unwrap();
    assert_eq!(
        (tag.as_str(), arg.as_str()),
        ("!Ref", Some("ApplicationName"))
    );
    assert_eq!(
        dims[1]["Value"],
        *at(template, "template", &["Outputs", "WorkerStream", "Value"]),
        "{what}: {name}'s StreamName is not the workers' worker.stream"
    );
    assert_eq!(text(query, what, &["MetricStat", "Stat"]), "Maximum");
    name
}

/// The queries of a metric-math list, by id: (id, metric name or expression).
fn math(template: &Value, metrics: &Value, what: &str) -> BTreeMap<String, String> {
    metrics
        .as_sequence()
        .unwrap()
        .iter()
        .map(|q| {
            let id = text(q, what, &["Id"]).to_owned();
            let body = match q.get("Expression") {
                Some(e) => {
                    assert!(flag(q, what, &["ReturnData"]), "{what}: {id}");
                    e.as_str().unwrap().to_owned()
                }
                None => {
                    assert!(!flag(q, what, &["ReturnData"]), "{what}: {id}");
                    assert_worker_metric(template, q, what)
                }
            };
            (id, body)
        })
        .collect()
}

#[test]
fn the_stack_alarms_on_too_few_workers_and_scales_an_ecs_service_to_the_recommendation() {
    let template = template();
    for name in [
        "EcsClusterName",
        "EcsServiceName",
        "MinWorkers",
        "MaxWorkers",
        "ScalingAlarmTopic",
    ] {
        text(&template, "template", &["Parameters", name, "Type"]);
    }
    let alarm = named(&template, "WorkersShortAlarm", "AWS::CloudWatch::Alarm");
    let what = "WorkersShortAlarm";
    assert!(alarm.get("Condition").is_none(), "the alarm is always made");
    let queries = math(&template, at(alarm, what, &["Properties", "Metrics"]), what);
    assert_eq!(queries["recommended"], "RecommendedWorkers");
    assert_eq!(queries["workers"], "FleetWorkers");
    assert_eq!(queries["short"], "recommended - workers");
    assert_eq!(
        text(alarm, what, &["Properties", "ComparisonOperator"]),
        "GreaterThanThreshold"
    );

    let target = named(
        &template,
        "WorkerScalableTarget",
        "AWS::ApplicationAutoScaling::ScalableTarget",
    );
    let policy = named(
        &template,
        "WorkerScalingPolicy",
        "AWS::ApplicationAutoScaling::ScalingPolicy",
    );
    for (name, resource) in [
        ("WorkerScalableTarget", target),
        ("WorkerScalingPolicy", policy),
    ] {
        assert_eq!(text(resource, name, &["Condition"]), "ScaleEcsService");
    }
    at(&template, "template", &["Conditions", "ScaleEcsService"]);
    assert_eq!(
        text(target, "target", &["Properties", "ScalableDimension"]),
        "ecs:service:DesiredCount"
    );
    let what = "WorkerScalingPolicy";
    assert_eq!(
        text(policy, what, &["Properties", "PolicyType"]),
        "TargetTrackingScaling"
    );
    let (tag, arg) = tagged(at(policy, what, &["Properties", "ScalingTargetId"])).unwrap();
    assert_eq!(
        (tag.as_str(), arg.as_str()),
        ("!Ref", Some("WorkerScalableTarget"))
    );
    let config = at(
        policy,
        what,
        &["Properties", "TargetTrackingScalingPolicyConfiguration"],
    );
    // recommended / workers held at 1: the desired count is the recommendation.
    assert_eq!(number(config, what, &["TargetValue"]), 1);
    let queries = math(
        &template,
        at(config, what, &["CustomizedMetricSpecification", "Metrics"]),
        what,
    );
    assert_eq!(queries["recommended"], "RecommendedWorkers");
    assert_eq!(queries["workers"], "FleetWorkers");
    assert_eq!(queries["ratio"], "recommended / workers");
}
