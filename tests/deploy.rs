//! `deploy/` checked against the code, without servers, Docker or a cluster:
//!
//! * the Kubernetes manifests and the CloudFormation template parse, and say what the
//!   service needs (a grace period that covers the drain, probes on the status port,
//!   a locked-down pod, a lease table with PITR and deletion protection, metrics fenced
//!   by namespace);
//! * the IAM policies grant exactly the AWS actions the adapters call, no more and no
//!   fewer: each adapter's `IAM_ACTIONS` is checked against the SDK calls in its source,
//!   and the policies against the union of `IAM_ACTIONS`, less what a worker never does;
//! * the Dockerfile is multi-stage, runs as a numeric non-root user and stops on SIGTERM.
//!
//! The CloudFormation template uses the short-form tags (`!Ref`, `!Sub`, `!GetAtt`...);
//! serde_yaml_ng keeps them as `Value::Tagged`, which [`tagged`] unwraps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_actors::backend::aws::{
    CLOUDWATCH_IAM_ACTIONS, DYNAMODB_IAM_ACTIONS, KINESIS_IAM_ACTIONS,
};
use flotilla_actors::settings::Settings;
use serde_yaml_ng::Value;

/// Actions the adapters call that a deployed worker never makes, so no policy in
/// `deploy/` grants them: [`StreamAdmin`](flotilla_actors::backend::StreamAdmin)'s
/// calls, for the demo's producer, tests and operators.
const NEVER_GRANTED: &[&str] = &[
    "kinesis:CreateStream",
    "kinesis:DeleteStream",
    "kinesis:PutRecords",
    "kinesis:SplitShard",
    "kinesis:MergeShards",
    // `flotilla consumer deregister`.
    "kinesis:DeregisterStreamConsumer",
];

/// What only a worker in fan-out mode calls (reader.mode = "fanout"): granted by the
/// stack with `ReadMode=fanout`, and by `deploy/iam-policy-fanout.json`.
const FANOUT_ONLY: &[&str] = &[
    "kinesis:RegisterStreamConsumer",
    "kinesis:ListStreamConsumers",
    "kinesis:DescribeStreamConsumer",
    "kinesis:SubscribeToShard",
];

/// The actions on a fan-out consumer's ARN rather than the stream's.
const ON_THE_CONSUMER: &[&str] = &["kinesis:DescribeStreamConsumer", "kinesis:SubscribeToShard"];

/// Not granted by the CloudFormation stack, which makes the lease table itself (a
/// worker calls CreateTable only when the table is missing). `deploy/iam-policy.json`,
/// for tables made by the first worker, does grant it.
const MADE_BY_THE_STACK: &[&str] = &["dynamodb:CreateTable"];

/// The three adapters: file, IAM service prefix, and the `IAM_ACTIONS` it declares.
const ADAPTERS: &[(&str, &str, &[&str])] = &[
    ("kinesis.rs", "kinesis", KINESIS_IAM_ACTIONS),
    ("dynamodb.rs", "dynamodb", DYNAMODB_IAM_ACTIONS),
    ("cloudwatch.rs", "cloudwatch", CLOUDWATCH_IAM_ACTIONS),
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
    assert!(!settings.worker.stream.is_empty());
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

/// The statements in force in a read mode: a statement may be `!If [FanOut, S,
/// !Ref AWS::NoValue]`, present in fan-out mode only.
fn statements(policy_document: &Value, fanout: bool) -> Vec<&Value> {
    at(policy_document, "policy", &["Statement"])
        .as_sequence()
        .expect("Statement is not a list")
        .iter()
        .filter_map(|statement| match tagged(statement) {
            Some((tag, args)) if tag == "!If" => {
                let args = args.as_sequence().expect("!If takes a list");
                assert_eq!(args[0].as_str(), Some("FanOut"), "{statement:?}");
                assert_eq!(
                    tagged(&args[2]).map(|(tag, v)| (tag, v.as_str().map(str::to_owned))),
                    Some(("!Ref".to_owned(), Some("AWS::NoValue".to_owned()))),
                    "{statement:?}"
                );
                fanout.then_some(&args[1])
            }
            Some((tag, _)) => panic!("a statement tagged {tag}"),
            None => Some(statement),
        })
        .collect()
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

/// Every action the policy allows; refuses wildcards and Deny statements (whose
/// arithmetic this test does not do).
fn granted(policy_document: &Value, fanout: bool) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for statement in statements(policy_document, fanout) {
        assert_eq!(text(statement, "statement", &["Effect"]), "Allow");
        for action in actions(statement) {
            assert!(
                !action.contains('*'),
                "{action}: a wildcard is not least privilege"
            );
            assert!(all.insert(action.clone()), "{action} is granted twice");
        }
    }
    all
}

/// The statement that grants `action`.
fn statement_for<'a>(policy_document: &'a Value, action: &str) -> &'a Value {
    statements(policy_document, true)
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

#[test]
fn the_template_declares_its_parameters_and_outputs() {
    let template = template();
    for name in [
        "ApplicationName",
        "StreamName",
        "CreateStream",
        "ShardCount",
        "MetricsNamespace",
    ] {
        text(&template, "template", &["Parameters", name, "Type"]);
    }
    assert_eq!(
        text(
            &template,
            "template",
            &["Parameters", "CreateStream", "Default"]
        ),
        "false"
    );
    for output in [
        "LeaseTableName",
        "LeaseTableArn",
        "StreamArn",
        "WorkerPolicyArn",
    ] {
        at(&template, "template", &["Outputs", output, "Value"]);
    }
    // The stream is made only on request.
    let stream = resource(&template, "AWS::Kinesis::Stream");
    let condition = text(stream, "Stream", &["Condition"]);
    at(&template, "template", &["Conditions", condition]);
}

#[test]
fn the_lease_table_is_on_demand_keyed_by_lease_key_and_protected() {
    let template = template();
    let table = at(
        resource(&template, "AWS::DynamoDB::Table"),
        "LeaseTable",
        &["Properties"],
    );
    let name = tagged(at(table, "LeaseTable", &["TableName"]));
    assert_eq!(
        name.map(|(tag, arg)| (tag, arg.as_str().unwrap().to_owned())),
        Some(("!Ref".to_owned(), "ApplicationName".to_owned())),
        "the table must be named after the application"
    );
    assert_eq!(
        text(table, "LeaseTable", &["BillingMode"]),
        "PAY_PER_REQUEST"
    );
    let key = at(table, "LeaseTable", &["KeySchema"])
        .as_sequence()
        .unwrap();
    assert_eq!(key.len(), 1, "the KCL lease table has a hash key only");
    assert_eq!(text(&key[0], "KeySchema", &["AttributeName"]), "leaseKey");
    assert_eq!(text(&key[0], "KeySchema", &["KeyType"]), "HASH");
    let attributes = at(table, "LeaseTable", &["AttributeDefinitions"])
        .as_sequence()
        .unwrap();
    assert_eq!(attributes.len(), 1);
    assert_eq!(
        text(&attributes[0], "AttributeDefinitions", &["AttributeName"]),
        "leaseKey"
    );
    assert_eq!(
        text(&attributes[0], "AttributeDefinitions", &["AttributeType"]),
        "S"
    );
    assert!(flag(
        table,
        "LeaseTable",
        &[
            "PointInTimeRecoverySpecification",
            "PointInTimeRecoveryEnabled"
        ]
    ));
    assert!(flag(table, "LeaseTable", &["DeletionProtectionEnabled"]));
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

#[test]
fn kinesis_and_dynamodb_actions_are_scoped_to_the_stream_and_the_table() {
    let template = template();
    let policy = worker_policy(&template);
    let stream_arn =
        "arn:${AWS::Partition}:kinesis:${AWS::Region}:${AWS::AccountId}:stream/${StreamName}";
    let consumer_arn = format!("{stream_arn}/consumer/${{Consumer}}:*");
    for action in granted(policy, true) {
        if ON_THE_CONSUMER.contains(&action.as_str()) {
            // !Sub [ARN, {Consumer: !If [named for the app, !Ref app, !Ref name]}]
            let statement = statement_for(policy, &action);
            let resource = at(statement, &action, &["Resource"]);
            let (tag, args) = tagged(resource).expect("a !Sub");
            let args = args.as_sequence().expect("!Sub [text, variables]");
            assert_eq!(
                (tag.as_str(), args[0].as_str()),
                ("!Sub", Some(consumer_arn.as_str())),
                "{action}"
            );
            let consumer = tagged(&args[1]["Consumer"]).expect("Consumer: !If");
            assert_eq!(consumer.0, "!If", "{action}");
            continue;
        }
        let expected = match action.split(':').next().unwrap() {
            "kinesis" => ("!Sub", stream_arn),
            "dynamodb" => ("!GetAtt", "LeaseTable.Arn"),
            // No resource-level permissions: fenced by its namespace condition instead.
            "cloudwatch" => continue,
            other => panic!("{action}: no rule for {other} actions in this test"),
        };
        let statement = statement_for(policy, &action);
        let resource = at(statement, &action, &["Resource"]);
        let scoped = tagged(resource).map(|(tag, arg)| (tag, arg.as_str().map(str::to_owned)));
        assert_eq!(
            scoped,
            Some((expected.0.to_owned(), Some(expected.1.to_owned()))),
            "{action}: Resource {resource:?} is not {} {}",
            expected.0,
            expected.1
        );
    }
}

// ---- IAM actions against the code -------------------------------------------------

/// The SDK operations `source` calls: each `client` (a whole word: `self.client`, or a
/// `client` variable) followed, across whitespace and line breaks, by `.operation(`.
/// Whole-line comments and the `#[cfg(test)]` module are not production calls.
///
/// A builder may be sent later (`let request = self.client.list_shards()...;
/// request.send()`), so the scan does not look for `.send()`: every method on an SDK
/// client but `config` is an operation.
fn sdk_operations(source: &str) -> BTreeSet<String> {
    let production = source.split("#[cfg(test)]").next().unwrap();
    let code: String = production
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = BTreeSet::new();
    for (start, _) in code.match_indices("client") {
        if code[..start].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = &code[start + "client".len()..];
        let Some(call) = rest.trim_start().strip_prefix('.') else {
            continue;
        };
        let name: String = call.chars().take_while(|&c| is_ident(c)).collect();
        if call[name.len()..].starts_with('(') && name != "config" {
            found.insert(name);
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
/// take of an expired lease) is an Update and a ConditionCheck.
fn iam_actions(operation: &str) -> Vec<String> {
    match operation {
        "transact_write_items" => vec!["UpdateItem".into(), "ConditionCheckItem".into()],
        _ => vec![action_name(operation)],
    }
}

fn difference(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

/// Every action the adapters declare, less the ones no worker needs (and, for a polling
/// worker, the fan-out calls).
fn worker_actions(fanout: bool) -> BTreeSet<String> {
    let all: BTreeSet<String> = ADAPTERS
        .iter()
        .flat_map(|(_, _, actions)| actions.iter().map(|a| a.to_string()))
        .collect();
    for action in NEVER_GRANTED
        .iter()
        .chain(MADE_BY_THE_STACK)
        .chain(FANOUT_ONLY)
    {
        assert!(
            all.contains(*action),
            "{action} is listed as not granted, but no adapter calls it any more: drop it from tests/deploy.rs"
        );
    }
    all.into_iter()
        .filter(|a| !NEVER_GRANTED.contains(&a.as_str()))
        .filter(|a| fanout || !FANOUT_ONLY.contains(&a.as_str()))
        .collect()
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
        #[cfg(test)]
        mod tests { fn f() { self.client.delete_stream(); } }
    "#;
    let found: Vec<String> = sdk_operations(source).into_iter().collect();
    assert_eq!(found, ["list_shards", "put_item", "scan"]);
    assert_eq!(
        action_name("describe_stream_summary"),
        "DescribeStreamSummary"
    );
    assert_eq!(action_name("put_metric_data"), "PutMetricData");
}

#[test]
fn each_adapters_iam_actions_are_the_sdk_calls_in_its_source() {
    for (file, service, declared) in ADAPTERS {
        let path = format!("actors/src/backend/aws/{file}");
        let called: BTreeSet<String> = sdk_operations(&read(&path))
            .iter()
            .flat_map(|op| iam_actions(op))
            .map(|action| format!("{service}:{action}"))
            .collect();
        let declared_set: BTreeSet<String> = declared.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            declared.len(),
            declared_set.len(),
            "{path}: IAM_ACTIONS lists an action twice"
        );
        assert!(
            !called.is_empty(),
            "{path}: found no SDK call; is the scan broken?"
        );
        assert!(
            called == declared_set,
            "{path}: IAM_ACTIONS does not match the SDK calls in the file.\n  \
             called but not in IAM_ACTIONS: {:?}\n  in IAM_ACTIONS but not called: {:?}",
            difference(&called, &declared_set),
            difference(&declared_set, &called),
        );
    }
}

#[test]
fn the_stacks_policy_grants_exactly_what_a_worker_calls() {
    let template = template();
    for fanout in [false, true] {
        let granted = granted(worker_policy(&template), fanout);
        let needed: BTreeSet<String> = worker_actions(fanout)
            .into_iter()
            .filter(|a| !MADE_BY_THE_STACK.contains(&a.as_str()))
            .collect();
        assert!(
            granted == needed,
            "deploy/cloudformation/flotilla.yaml's WorkerPolicy (fan-out: {fanout}) is not what \
             the adapters call.\n  \
             called but not granted (workers will get AccessDenied): {:?}\n  \
             granted but never called (not least privilege): {:?}",
            difference(&needed, &granted),
            difference(&granted, &needed),
        );
    }
    at(&template, "template", &["Conditions", "FanOut"]);
    text(&template, "template", &["Parameters", "ReadMode", "Type"]);
}

#[test]
fn the_standalone_policy_grants_exactly_what_a_worker_calls() {
    for (file, fanout) in [
        ("deploy/iam-policy.json", false),
        ("deploy/iam-policy-fanout.json", true),
    ] {
        let policy = yaml(file);
        let granted = granted(&policy, fanout);
        let needed = worker_actions(fanout);
        assert!(
            granted == needed,
            "{file} is not what the adapters call.\n  \
             called but not granted (workers will get AccessDenied): {:?}\n  \
             granted but never called (not least privilege): {:?}",
            difference(&needed, &granted),
            difference(&granted, &needed),
        );
        let statement = statement_for(&policy, "cloudwatch:PutMetricData");
        at(
            statement,
            "PutMetricData statement",
            &["Condition", "StringEquals", "cloudwatch:namespace"],
        );
        for action in ON_THE_CONSUMER.iter().filter(|_| fanout) {
            let resource = text(statement_for(&policy, action), action, &["Resource"]);
            assert!(
                resource.ends_with("/consumer/${ConsumerName}:*"),
                "{file}: {resource}"
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
