//! The emulator harness against the real emulators: each one starts, answers the generated
//! gRPC clients of `gcloud-sdk`, and stops. A missing emulator is a failure here, never a skip.

use std::collections::HashMap;
use std::time::Duration;

use gcloud_sdk::google::bigtable::admin::v2::bigtable_table_admin_client::BigtableTableAdminClient;
use gcloud_sdk::google::bigtable::admin::v2::{ColumnFamily, CreateTableRequest, Table};
use gcloud_sdk::google::bigtable::v2::bigtable_client::BigtableClient;
use gcloud_sdk::google::bigtable::v2::{MutateRowRequest, Mutation, ReadRowsRequest, mutation};
use gcloud_sdk::google::cloud::tasks::v2::cloud_tasks_client::CloudTasksClient;
use gcloud_sdk::google::cloud::tasks::v2::{
    CreateQueueRequest, CreateTaskRequest, HttpMethod, HttpRequest, ListQueuesRequest, Queue, Task,
    task,
};
use gcloud_sdk::google::pubsub::v1::publisher_client::PublisherClient;
use gcloud_sdk::google::pubsub::v1::subscriber_client::SubscriberClient;
use gcloud_sdk::google::pubsub::v1::{
    AcknowledgeRequest, PublishRequest, PubsubMessage, PullRequest, Subscription, Topic,
};
use gcp_sql::emulators::{Emulator, EmulatorKind, EmulatorOptions, plaintext_channel, shared};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Upper bound for an emulator to deliver what it was given (a pull, a task dispatch); only
/// reached when something is broken.
const DELIVERY_BOUND: Duration = Duration::from_secs(60);

#[tokio::test]
async fn pubsub_emulator_publishes_and_delivers_a_message() {
    let emulator = shared(EmulatorKind::PubSub).await;
    assert_eq!(emulator.env_var(), "PUBSUB_EMULATOR_HOST");
    let channel = plaintext_channel(emulator.host()).await.unwrap();
    let mut publisher = PublisherClient::new(channel.clone());
    let mut subscriber = SubscriberClient::new(channel);

    // Topic and subscription ids follow the service's naming rule, which the emulator checks
    // too: 3 to 255 characters, starting with a letter (the `Topic.name` and
    // `Subscription.name` comments of googleapis' `google/pubsub/v1/pubsub.proto`).
    let topic = "projects/smoke/topics/smoke-topic".to_string();
    let subscription = "projects/smoke/subscriptions/smoke-sub".to_string();
    publisher
        .create_topic(Topic {
            name: topic.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    subscriber
        .create_subscription(Subscription {
            name: subscription.clone(),
            topic: topic.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let published = publisher
        .publish(PublishRequest {
            topic: topic.clone(),
            messages: vec![PubsubMessage {
                data: b"hello".to_vec(),
                attributes: HashMap::from([("origin".to_string(), "smoke".to_string())]),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(published.message_ids.len(), 1);

    let received = tokio::time::timeout(DELIVERY_BOUND, async {
        loop {
            let pulled = subscriber
                .pull(PullRequest {
                    subscription: subscription.clone(),
                    max_messages: 10,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if !pulled.received_messages.is_empty() {
                return pulled.received_messages;
            }
        }
    })
    .await
    .expect("the published message was never delivered");
    assert_eq!(received.len(), 1);
    let message = received[0].message.clone().unwrap();
    assert_eq!(message.data, b"hello");
    assert_eq!(
        message.attributes.get("origin").map(String::as_str),
        Some("smoke")
    );
    assert_eq!(message.message_id, published.message_ids[0]);
    subscriber
        .acknowledge(AcknowledgeRequest {
            subscription,
            ack_ids: vec![received[0].ack_id.clone()],
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn bigtable_emulator_creates_a_table_and_reads_back_a_row() {
    let emulator = shared(EmulatorKind::Bigtable).await;
    assert_eq!(emulator.env_var(), "BIGTABLE_EMULATOR_HOST");
    let channel = plaintext_channel(emulator.host()).await.unwrap();
    let mut admin = BigtableTableAdminClient::new(channel.clone());
    let mut data = BigtableClient::new(channel);

    let table = admin
        .create_table(CreateTableRequest {
            parent: "projects/smoke/instances/smoke".into(),
            table_id: "smoke_table".into(),
            table: Some(Table {
                column_families: HashMap::from([("cf".to_string(), ColumnFamily::default())]),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        table.name,
        "projects/smoke/instances/smoke/tables/smoke_table"
    );

    data.mutate_row(MutateRowRequest {
        table_name: table.name.clone(),
        row_key: b"row-1".to_vec(),
        mutations: vec![Mutation {
            mutation: Some(mutation::Mutation::SetCell(mutation::SetCell {
                family_name: "cf".into(),
                column_qualifier: b"greeting".to_vec(),
                // Millisecond-aligned, as the emulator's default granularity wants.
                timestamp_micros: 1_700_000_000_000_000,
                value: b"hello".to_vec(),
            })),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();

    let mut rows = data
        .read_rows(ReadRowsRequest {
            table_name: table.name,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut cells = Vec::new();
    while let Some(response) = rows.message().await.unwrap() {
        for chunk in response.chunks {
            cells.push((
                chunk.row_key,
                chunk.qualifier,
                chunk.value,
                chunk.timestamp_micros,
            ));
        }
    }
    assert_eq!(
        cells,
        vec![(
            b"row-1".to_vec(),
            Some(b"greeting".to_vec()),
            b"hello".to_vec(),
            1_700_000_000_000_000
        )]
    );
}

#[tokio::test]
async fn cloud_tasks_emulator_creates_a_queue_and_dispatches_a_task() {
    let emulator = shared(EmulatorKind::CloudTasks).await;
    assert_eq!(emulator.env_var(), "CLOUD_TASKS_EMULATOR_HOST");
    let channel = plaintext_channel(emulator.host()).await.unwrap();
    let mut tasks = CloudTasksClient::new(channel);

    let parent = "projects/smoke/locations/here".to_string();
    let queue_name = format!("{parent}/queues/smoke-queue");
    tasks
        .create_queue(CreateQueueRequest {
            parent: parent.clone(),
            queue: Some(Queue {
                name: queue_name.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let listed = tasks
        .list_queues(ListQueuesRequest {
            parent: parent.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed
            .queues
            .iter()
            .map(|q| q.name.as_str())
            .collect::<Vec<_>>(),
        vec![queue_name.as_str()]
    );

    // The emulator dispatches HTTP tasks to their URL: serve one request and look at it.
    let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", target.local_addr().unwrap());
    tasks
        .create_task(CreateTaskRequest {
            parent: queue_name,
            task: Some(Task {
                message_type: Some(task::MessageType::HttpRequest(HttpRequest {
                    url,
                    http_method: HttpMethod::Post as i32,
                    body: b"task-body".to_vec(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let request = tokio::time::timeout(DELIVERY_BOUND, async {
        let (mut socket, _) = target.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&request).contains("task-body") {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed before the body arrived");
            request.extend_from_slice(&buffer[..read]);
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8_lossy(&request).into_owned()
    })
    .await
    .expect("the task was never dispatched");
    assert!(request.starts_with("POST /hook "), "{request}");
}

#[tokio::test]
async fn dropping_an_emulator_stops_it() {
    crate::support::require_emulators(&[EmulatorKind::Bigtable]);
    let emulator = Emulator::start(EmulatorKind::Bigtable).await.unwrap();
    let host = emulator.host().to_string();
    let log = emulator.log_path().to_path_buf();
    assert!(tokio::net::TcpStream::connect(&host).await.is_ok());
    assert!(!log.exists(), "the log of a running emulator has no name");
    drop(emulator);
    let refused = tokio::net::TcpStream::connect(&host).await;
    assert!(
        refused.is_err(),
        "{host} still accepts connections after the emulator was dropped"
    );
    assert!(!log.exists(), "the log of a stopped emulator is removed");
}

#[tokio::test]
async fn missing_emulator_program_fails_with_its_install_step() {
    for (kind, install) in [
        (
            EmulatorKind::PubSub,
            "apt-get install google-cloud-cli-pubsub-emulator",
        ),
        (
            EmulatorKind::Bigtable,
            "apt-get install google-cloud-cli-bigtable-emulator",
        ),
        (
            EmulatorKind::CloudTasks,
            "pip install gcloud-tasks-emulator",
        ),
    ] {
        let options = EmulatorOptions::new().program("/nonexistent/emulator");
        let error = Emulator::start_with(kind, options)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("the {} emulator is not installed", kind.name())),
            "{error}"
        );
        assert!(error.contains(install), "{error}");
        assert!(error.contains("/nonexistent/emulator"), "{error}");
    }
}

/// The local addresses of every socket listening on TCP `port`, from the kernel's tables
/// (`/proc/net/tcp` and `/proc/net/tcp6`: the address as hex words in host byte order, the
/// port as big-endian hex, state `0A` is LISTEN).
fn listening_addresses(port: u16) -> Vec<std::net::IpAddr> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            let Some((address, local_port)) = local.split_once(':') else {
                continue;
            };
            if *state != "0A" || u16::from_str_radix(local_port, 16) != Ok(port) {
                continue;
            }
            let words: Vec<u32> = (0..address.len() / 8)
                .map(|i| u32::from_str_radix(&address[i * 8..i * 8 + 8], 16).unwrap())
                .collect();
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            found.push(match bytes.len() {
                4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap()),
                _ => std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap()),
            });
        }
    }
    found
}

#[tokio::test]
async fn every_emulator_listens_on_loopback_only() {
    for kind in crate::support::all_emulators() {
        let emulator = shared(kind).await;
        let port: u16 = emulator
            .host()
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{kind}: unexpected host {}", emulator.host()));
        let addresses = listening_addresses(port);
        assert!(
            !addresses.is_empty(),
            "{kind}: nothing listens on port {port}"
        );
        for address in &addresses {
            let loopback = match address {
                std::net::IpAddr::V4(v4) => v4.is_loopback(),
                std::net::IpAddr::V6(v6) => {
                    v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
                }
            };
            assert!(
                loopback,
                "the {kind} emulator listens on {address} port {port}, not on loopback only"
            );
        }
    }
}

#[tokio::test]
async fn the_cloud_tasks_emulator_leaves_no_start_up_hook_behind() {
    crate::support::require_emulators(&[EmulatorKind::CloudTasks]);
    let dir = tempfile::tempdir().unwrap();
    let emulator = Emulator::start_with(
        EmulatorKind::CloudTasks,
        EmulatorOptions::new().log_dir(dir.path()),
    )
    .await
    .unwrap();
    // The log is unlinked at spawn and the hook's folder is gone once it answers.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the log folder: {left:?}");
    drop(emulator);
}
