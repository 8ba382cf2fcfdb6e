//! The attach server over real sockets: the protocol, many clients, slow and broken clients,
//! tokens, permissions.

#[path = "support/raw_client.rs"]
mod raw_client;
#[path = "support/toy.rs"]
mod toy;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use allocview_agent::agent::{Agent, AgentError};
use allocview_agent::client::{AttachClient, CONNECT_TIMEOUT, ClientError, ClientUpdate};
use allocview_agent::protocol::{
    self, ClientFrame, DeviceUpdate, MAGIC, MAX_SERVER_FRAME, PROTOCOL_VERSION, ServerFrame,
    StateUpdate,
};
use allocview_agent::server::ServerError;
use allocview_agent::state::AgentState;
use allocview_alloc::event::{Event, EventAction, EventPool};
use allocview_alloc::snapshot::Snapshot;
use raw_client::{WAIT, raw_hello, send_hello, unix_agent};

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;

/// Waits for an update after which `cond` holds.
fn wait_for(client: &mut AttachClient, cond: impl Fn(&AgentState) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond(client.state()) {
        assert!(Instant::now() < deadline, "condition not reached");
        match client.next_update(Duration::from_millis(200)) {
            Ok(_) | Err(ClientError::Timeout) => {}
            Err(e) => panic!("client failed: {e}"),
        }
    }
}

fn wait_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "condition not reached");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every frame, one of each: the match makes a new variant a compile error here.
fn every_frame() -> (Vec<ServerFrame>, Vec<ClientFrame>) {
    let server = vec![
        ServerFrame::Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION,
            pid: 42,
            process: "train.py".into(),
            token_required: true,
            update_interval_ms: 100,
        },
        ServerFrame::Full {
            state: Box::default(),
        },
        ServerFrame::Update {
            update: Box::new(StateUpdate {
                time_ns: 7,
                devices: vec![DeviceUpdate {
                    device: 1,
                    total_memory: Some((80 << 30, Some(40 << 30))),
                    ..DeviceUpdate::default()
                }],
                ..StateUpdate::default()
            }),
        },
        ServerFrame::Snapshot {
            snapshot: Box::new(Snapshot::default()),
        },
        ServerFrame::Ack {
            request: "reset_peaks".into(),
        },
        ServerFrame::Error {
            message: "no".into(),
            fatal: true,
        },
        ServerFrame::Goodbye {
            reason: "bye".into(),
        },
    ];
    for f in &server {
        match f {
            ServerFrame::Hello { .. }
            | ServerFrame::Full { .. }
            | ServerFrame::Update { .. }
            | ServerFrame::Snapshot { .. }
            | ServerFrame::Ack { .. }
            | ServerFrame::Error { .. }
            | ServerFrame::Goodbye { .. } => {}
        }
    }
    let client = vec![
        ClientFrame::Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION,
            token: Some("t".into()),
        },
        ClientFrame::RequestSnapshot,
        ClientFrame::ResetPeaks,
        ClientFrame::Pause { paused: true },
    ];
    for f in &client {
        match f {
            ClientFrame::Hello { .. }
            | ClientFrame::RequestSnapshot
            | ClientFrame::ResetPeaks
            | ClientFrame::Pause { .. } => {}
        }
    }
    (server, client)
}

fn type_of<T: serde::Serialize>(frame: &T) -> String {
    serde_json::to_value(frame).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn every_frame_round_trips_and_is_documented_in_protocol_md() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md"))
        .unwrap();
    let (server, client) = every_frame();
    for f in &server {
        let mut bytes = Vec::new();
        protocol::write_frame(&mut bytes, f).unwrap();
        assert_eq!(
            u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - 4
        );
        let back: ServerFrame = protocol::read_frame(&mut &bytes[..], MAX_SERVER_FRAME).unwrap();
        assert_eq!(&back, f);
        let t = type_of(f);
        assert!(
            doc.contains(&format!("| `{t}` |")),
            "protocol.md lacks agent frame {t}"
        );
    }
    for f in &client {
        let mut bytes = Vec::new();
        protocol::write_frame(&mut bytes, f).unwrap();
        let back: ClientFrame = protocol::read_frame(&mut &bytes[..], MAX_SERVER_FRAME).unwrap();
        assert_eq!(&back, f);
        let t = type_of(f);
        assert!(
            doc.contains(&format!("| `{t}` |")),
            "protocol.md lacks client frame {t}"
        );
    }
    // The wire form of the hello is fixed: a change here is a protocol change.
    assert_eq!(
        serde_json::to_string(&client[0]).unwrap(),
        r#"{"type":"hello","magic":"allocview-attach","version":1,"token":"t"}"#
    );
    // Every frame type the document names exists.
    let known: Vec<String> = server
        .iter()
        .map(type_of)
        .chain(client.iter().map(type_of))
        .collect();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let t = line.split('`').nth(1).unwrap();
        assert!(
            known.iter().any(|k| k == t),
            "protocol.md names unknown frame {t}"
        );
    }
    // Each frame's row names every field the frame carries (`hello` has a row in each table).
    let (agent_frames, client_frames) = doc
        .split_once("## Client frames")
        .expect("protocol.md has a Client frames section");
    let frames = server
        .iter()
        .map(|f| (agent_frames, serde_json::to_value(f).unwrap()))
        .chain(
            client
                .iter()
                .map(|f| (client_frames, serde_json::to_value(f).unwrap())),
        );
    for (table, frame) in frames {
        let t = frame["type"].as_str().unwrap();
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| `{t}` |")))
            .unwrap();
        for field in frame.as_object().unwrap().keys().filter(|k| *k != "type") {
            assert!(
                row.contains(&format!("`{field}`")),
                "protocol.md's {t} row does not name its field {field}"
            );
        }
    }
    // So does the state-and-updates section for the state's, an update's and a device
    // update's fields.
    let section = doc
        .split_once("## State and updates")
        .and_then(|(_, rest)| rest.split_once("## Versioning"))
        .expect("protocol.md has a State and updates section")
        .0;
    let state = serde_json::to_value(AgentState::default()).unwrap();
    let update = serde_json::to_value(StateUpdate {
        devices: vec![DeviceUpdate::default()],
        ..StateUpdate::default()
    })
    .unwrap();
    for object in [&state, &update, &update["devices"][0]] {
        for field in object.as_object().unwrap().keys() {
            assert!(
                section.contains(&format!("`{field}`")),
                "protocol.md's State and updates section does not name {field}"
            );
        }
    }
}

#[test]
fn a_client_gets_the_full_state_then_updates_that_track_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let mut client = AttachClient::connect(&addr, None).unwrap();
    assert_eq!(client.process().0, std::process::id());
    assert!(client.state().devices.is_empty());
    let sink = agent.sink();
    for i in 0..10 {
        sink.publish(&Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            SEG + i * 20 * MIB,
            20 * MIB,
        ));
        sink.publish(&Event {
            requested: MIB,
            ..Event::new(
                EventAction::Alloc,
                0,
                EventPool::Large,
                SEG + i * 20 * MIB,
                2 * MIB,
            )
        });
    }
    agent.flush();
    let truth = agent.state();
    wait_for(&mut client, |s| {
        s.devices.first().map(|d| &d.stats) == Some(&truth.devices[0].stats)
    });
    let d = &client.state().devices[0];
    assert_eq!(d.segments, truth.devices[0].segments);
    assert_eq!(d.recent.len(), 20);
    assert_eq!(d.histograms, truth.devices[0].histograms);
    wait_for(&mut client, |s| s.pipeline.clients == 1);

    // Requests: reset peaks (no provider: the agent's own), snapshot, pause and resume.
    client.reset_peaks().unwrap();
    client.request_snapshot().unwrap();
    let mut acked = false;
    let mut snapshot = None;
    let deadline = Instant::now() + WAIT;
    while !(acked && snapshot.is_some()) {
        assert!(Instant::now() < deadline);
        match client.next_update(Duration::from_millis(200)) {
            Ok(ClientUpdate::Ack(r)) if r == "reset_peaks" => acked = true,
            Ok(ClientUpdate::Snapshot(s)) => snapshot = Some(s),
            Ok(_) | Err(ClientError::Timeout) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        snapshot.unwrap().segments.len(),
        0,
        "no provider: empty snapshot"
    );
    client.pause(true).unwrap();
    assert!(client.state().pipeline.paused);
    client.pause(false).unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline);
        if let Ok(ClientUpdate::Full) = client.next_update(Duration::from_millis(200)) {
            break;
        }
    }
    assert!(!client.state().pipeline.paused);
    agent.shutdown();
    // Updates still in flight may come first; the connection ends after them, with the
    // shutdown's goodbye (a clean end, not a lost connection).
    let mut last = client.next_update(WAIT).map(|_| ());
    while last.is_ok() {
        last = client.next_update(WAIT).map(|_| ());
    }
    let end = last.unwrap_err();
    assert!(end.is_agent_shutdown(), "{end:?}");
    assert!(!dir.path().join("agent.sock").exists(), "socket removed");
}

#[test]
fn fifty_clients_come_and_go_and_the_agent_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = AttachClient::connect(&addr, None).unwrap();
                if i % 2 == 0 {
                    let _ = c.next_update(Duration::from_millis(50));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    agent.sink().publish(&Event::new(
        EventAction::SegmentAlloc,
        0,
        EventPool::Large,
        SEG,
        2 * MIB,
    ));
    agent.flush();
    wait_until(|| agent.state().pipeline.clients == 0);
    let mut c = AttachClient::connect(&addr, None).unwrap();
    wait_for(&mut c, |s| s.devices.len() == 1);
}

#[test]
fn at_shutdown_a_client_gets_the_last_events_then_a_goodbye() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let mut c = AttachClient::connect(&addr, None).unwrap();
    assert!(c.state().devices.is_empty());
    // Published just before shutdown, with no flush: the shutdown drains it and sends it.
    agent.sink().publish(&Event::new(
        EventAction::SegmentAlloc,
        0,
        EventPool::Large,
        SEG,
        2 * MIB,
    ));
    agent.shutdown();
    let reason = loop {
        match c.next_update(WAIT) {
            Ok(_) => {}
            Err(ClientError::Disconnected(reason)) => break reason,
            Err(e) => panic!("expected a goodbye, got {e}"),
        }
    };
    assert_eq!(reason, "agent shutting down");
    assert_eq!(c.state().devices.len(), 1, "the last update arrived");
    assert_eq!(c.state().devices[0].segments.len(), 1);
}

#[test]
fn a_client_gets_an_oom_record_and_its_dump() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let mut c = AttachClient::connect(&addr, None).unwrap();
    agent.sink().publish(&Event {
        requested: 3 * MIB,
        ..Event::new(EventAction::Oom, 0, EventPool::Large, MIB, 4 * MIB)
    });
    wait_for(&mut c, |s| s.ooms.len() == 1);
    // Usually the dump has landed by the first update; when not, the record comes again (the
    // aggregator's unit test holds a dump back to see both sends).
    wait_for(&mut c, |s| !s.ooms[0].dump_pending);
    agent.flush();
    let truth = agent.state();
    assert_eq!(c.state().ooms, truth.ooms);
    assert_eq!(c.state().ooms[0].dump_paths.len(), 2);
    assert_eq!(c.state().ooms[0].requested, 3 * MIB);
}

#[test]
fn a_fast_tick_still_sends_clients_at_most_ten_updates_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let mut c = AttachClient::connect(&addr, None).unwrap();
    let sink = agent.sink();
    let started = Instant::now();
    let mut updates = 0u32;
    let mut i = 0;
    while started.elapsed() < Duration::from_millis(600) {
        // Something changes on every 5 ms tick.
        sink.publish(&Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            SEG + i * 2 * MIB,
            2 * MIB,
        ));
        i += 1;
        if c.next_update(Duration::from_millis(5)).is_ok() {
            updates += 1;
        }
    }
    let elapsed_ms = started.elapsed().as_millis() as u32;
    assert!(updates >= 1);
    // One every 100 ms at most (the tick alone would give one every 5 ms).
    assert!(
        updates <= elapsed_ms / 100 + 1,
        "{updates} updates in {elapsed_ms} ms"
    );
}

#[test]
fn listening_on_a_path_that_holds_a_file_refuses_and_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.ckpt");
    std::fs::write(&file, b"weights").unwrap();
    let err = Agent::builder()
        .listen(file.display().to_string())
        .dump_dir(dir.path().join("dumps"))
        .spawn()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a file that is not a socket is there"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"weights");
}

#[test]
fn listening_where_a_dead_agent_left_its_socket_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    // A listener dropped without removing its file: what a killed agent leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let (_agent, addr) = unix_agent(dir.path());
    AttachClient::connect(&addr, None).unwrap();
}

#[test]
fn discovery_lists_live_agents_only_and_removes_stale_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let (_agent, _) = unix_agent(dir.path());
    let live = dir.path().join("agent.sock");
    // Left by an agent killed by a signal: nobody listens (connect is refused).
    let stale = dir.path().join(format!("{}-2.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    // Named after a process that does not exist (beyond any pid_max).
    let gone = dir.path().join("4000000000.sock");
    let _held = std::os::unix::net::UnixListener::bind(&gone).unwrap();
    // Not a socket at all.
    let file = dir.path().join("notes.sock");
    std::fs::write(&file, b"notes").unwrap();
    let found = allocview_agent::client::find_sockets_in(dir.path());
    assert_eq!(found.sockets, vec![live.clone()]);
    assert!(!stale.exists(), "the stale socket is removed");
    assert_eq!(found.stale_removed, 1);
    assert!(
        gone.exists() && file.exists(),
        "anything else is left alone"
    );
    AttachClient::connect(&format!("unix:{}", live.display()), None).unwrap();
}

#[test]
fn discovery_counts_the_stale_sockets_it_removes_and_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // Two sockets whose listeners are gone (bound, then dropped: what killed agents leave).
    let stale: Vec<_> = ["1.sock", "2-3.sock"]
        .iter()
        .map(|n| dir.path().join(n))
        .collect();
    for s in &stale {
        drop(std::os::unix::net::UnixListener::bind(s).unwrap());
    }
    let found = allocview_agent::client::find_sockets_in(dir.path());
    assert!(found.sockets.is_empty(), "{found:?}");
    assert_eq!(found.stale_removed, 2);
    assert_eq!(
        found.stale_note().unwrap(),
        format!("removed 2 stale sockets in {}", dir.path().display())
    );
    assert!(stale.iter().all(|s| !s.exists()));
    // A second look finds nothing left to remove, and says nothing.
    let again = allocview_agent::client::find_sockets_in(dir.path());
    assert_eq!((again.stale_removed, again.stale_note()), (0, None));
    // One: the singular.
    drop(std::os::unix::net::UnixListener::bind(&stale[0]).unwrap());
    assert_eq!(
        allocview_agent::client::find_sockets_in(dir.path()).stale_note(),
        Some(format!(
            "removed 1 stale socket in {}",
            dir.path().display()
        ))
    );
}

#[test]
fn discovery_lists_an_agent_whose_pid_this_process_cannot_see() {
    let dir = tempfile::tempdir().unwrap();
    // What an agent in another PID namespace (a container sharing the folder) leaves: its
    // pid means nothing here, but it answers with its hello.
    let sock = dir.path().join("4000000001.sock");
    let _agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(dir.path().join("dumps"))
        .spawn()
        .unwrap();
    assert_eq!(
        allocview_agent::client::find_sockets_in(dir.path()).sockets,
        vec![sock]
    );
}

#[test]
fn attaching_to_a_file_that_is_not_a_socket_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.ckpt");
    std::fs::write(&file, b"weights").unwrap();
    let err = AttachClient::connect(&format!("unix:{}", file.display()), None).unwrap_err();
    assert!(matches!(err, ClientError::NotASocket(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to unix:{}: it is not a socket",
            file.display()
        )
    );
}

#[test]
fn a_paused_client_that_leaves_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let mut c = AttachClient::connect(&addr, None).unwrap();
    wait_until(|| agent.state().pipeline.clients == 1);
    c.pause(true).unwrap();
    // The agent acknowledges the pause once it holds.
    let deadline = Instant::now() + WAIT;
    while !matches!(
        c.next_update(Duration::from_millis(50)),
        Ok(ClientUpdate::Ack(_))
    ) {
        assert!(Instant::now() < deadline, "pause not acknowledged");
    }
    drop(c);
    wait_until(|| agent.state().pipeline.clients == 0);
}

#[test]
fn a_client_that_never_reads_is_disconnected_and_the_host_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(dir.path())
        .tick(Duration::from_millis(20))
        .client_queue(8)
        .write_timeout(Duration::from_millis(200))
        .spawn()
        .unwrap();
    // The stuck client: says hello, then never reads again.
    let mut stuck = UnixStream::connect(&sock).unwrap();
    let _: ServerFrame = protocol::read_frame(&mut stuck, MAX_SERVER_FRAME).unwrap();
    send_hello(&mut stuck);
    let mut good = AttachClient::connect(&format!("unix:{}", sock.display()), None).unwrap();
    wait_until(|| agent.state().pipeline.clients == 2);
    // Big updates: a thousand segments, and a layout change on every round, so each update
    // carries the whole segment list (about 250 KB): the stuck client's socket buffer fills,
    // then its queue.
    let sink = agent.sink();
    for i in 0..1000u64 {
        sink.publish(&Event::new(
            EventAction::SegmentAlloc,
            0,
            EventPool::Large,
            SEG + i * 2 * MIB,
            2 * MIB,
        ));
    }
    let mut i = 0u64;
    let deadline = Instant::now() + WAIT;
    while agent.state().pipeline.clients == 2 {
        assert!(
            Instant::now() < deadline,
            "the stuck client was never dropped"
        );
        sink.publish(&Event {
            requested: 512,
            ..Event::new(
                EventAction::Alloc,
                0,
                EventPool::Large,
                SEG + i * 2 * MIB,
                512,
            )
        });
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
        // The good client keeps up.
        while good.next_update(Duration::ZERO).is_ok() {}
    }
    // The host carries on: the good client still follows.
    agent.flush();
    let n = agent.state().devices[0].segments.len();
    wait_for(&mut good, |s| s.devices[0].segments.len() == n);
    assert_eq!(agent.state().pipeline.clients, 1);
    // The stuck client finds its connection closed once it reads what was buffered.
    stuck
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match stuck.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => panic!("expected the agent to close the connection, got {e}"),
        }
    }
}

fn expect_fatal_error_then_close(s: &mut UnixStream, needle: &str) {
    loop {
        match protocol::read_frame::<_, ServerFrame>(s, MAX_SERVER_FRAME) {
            Ok(ServerFrame::Error { message, fatal }) => {
                assert!(fatal);
                assert!(
                    message.contains(needle),
                    "{message:?} should mention {needle:?}"
                );
                break;
            }
            Ok(ServerFrame::Full { .. } | ServerFrame::Update { .. }) => {}
            other => panic!("expected an error frame, got {other:?}"),
        }
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
}

#[test]
fn garbage_oversized_frames_and_wrong_versions_get_an_error_and_a_disconnect() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = unix_agent(dir.path());
    let sock = dir.path().join("agent.sock");

    // Not our protocol at all: an HTTP request reads as a huge length.
    let mut s = raw_hello(&sock);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    expect_fatal_error_then_close(&mut s, "exceeds the limit");

    // A sane length, but not JSON.
    let mut s = raw_hello(&sock);
    s.write_all(&5u32.to_be_bytes()).unwrap();
    s.write_all(b"hello").unwrap();
    expect_fatal_error_then_close(&mut s, "malformed");

    // A hello of another version.
    let mut s = raw_hello(&sock);
    protocol::write_frame(
        &mut s,
        &ClientFrame::Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION + 1,
            token: None,
        },
    )
    .unwrap();
    expect_fatal_error_then_close(&mut s, "version mismatch");

    // Garbage after a good hello.
    let mut s = raw_hello(&sock);
    send_hello(&mut s);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(b"{x}").unwrap();
    expect_fatal_error_then_close(&mut s, "bad request");

    // The agent is unharmed.
    let mut c = AttachClient::connect(&format!("unix:{}", sock.display()), None).unwrap();
    agent.sink().publish(&Event::new(
        EventAction::SegmentAlloc,
        0,
        EventPool::Large,
        SEG,
        2 * MIB,
    ));
    wait_for(&mut c, |s| s.devices.len() == 1);
}

#[test]
fn tcp_with_a_token_refuses_clients_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .listen("127.0.0.1:0")
        .token("s3cret")
        .dump_dir(dir.path())
        .spawn()
        .unwrap();
    let addr = agent.listen_addr().unwrap().to_string();
    assert!(addr.starts_with("127.0.0.1:"));
    match AttachClient::connect(&addr, None) {
        Err(ClientError::Refused(m)) => assert!(m.contains("requires a token"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    match AttachClient::connect(&addr, Some("guess".into())) {
        Err(ClientError::Refused(m)) => assert!(m.contains("wrong token"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let c = AttachClient::connect(&addr, Some("s3cret".into())).unwrap();
    assert_eq!(c.state().process.pid, std::process::id());
}

#[test]
fn a_non_loopback_listener_without_a_token_is_refused_before_binding() {
    let err = Agent::builder()
        .listen("0.0.0.0:0")
        .no_token()
        .spawn()
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Server(ServerError::TokenRequired(_))),
        "{err}"
    );
    assert!(err.to_string().contains("without a token"));
    let err = Agent::builder()
        .listen("not an address")
        .spawn()
        .unwrap_err();
    assert!(matches!(err, AgentError::BadAddress(_)), "{err}");
}

#[test]
fn a_bad_address_says_what_is_wrong_with_it() {
    use allocview_agent::server::ListenAddr;
    for (addr, says) in [
        ("127.0.0.1:99999", "port 99999 is out of range (0 to 65535)"),
        ("localhost:http", "the port \"http\" is not a number"),
        (":9000", "no host before :9000"),
        ("unix:", "no path after unix:"),
        ("nonsense", "expected unix:PATH, a path, or HOST:PORT"),
    ] {
        let err = addr.parse::<ListenAddr>().unwrap_err();
        assert_eq!(err.addr, addr);
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("bad attach address {addr:?}: ")) && text.contains(says),
            "{addr}: {text}"
        );
    }
}

#[test]
fn an_empty_token_is_refused_not_taken_for_a_token() {
    // An empty token would let a client that sends an empty token in.
    for addr in ["0.0.0.0:0", "127.0.0.1:0"] {
        let err = Agent::builder().listen(addr).token("").spawn().unwrap_err();
        assert!(matches!(err, AgentError::EmptyToken), "{addr}: {err}");
        assert!(err.to_string().contains("token is empty"), "{err}");
    }
}

#[test]
fn the_default_socket_is_0600_in_a_0700_folder_and_removed_on_shutdown() {
    let agent = Agent::builder()
        .listen_default_socket()
        .dump_dir(tempfile::tempdir().unwrap().path())
        .spawn()
        .unwrap();
    let path = match agent.listen_addr().unwrap() {
        allocview_agent::server::ListenAddr::Unix(p) => p.clone(),
        other => panic!("expected a unix socket, got {other}"),
    };
    assert_eq!(
        path.parent().unwrap(),
        allocview_agent::client::default_socket_dir()
    );
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&std::process::id().to_string()), "{name}");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    assert!(
        allocview_agent::client::find_sockets()
            .sockets
            .contains(&path)
    );
    let c = AttachClient::connect(&format!("unix:{}", path.display()), None).unwrap();
    drop(c);
    agent.shutdown();
    assert!(!path.exists());
}

/// A listener on loopback that accepts one connection and hands it to `peer`, which keeps it
/// until it returns; the listener's address.
fn fake_peer(peer: impl FnOnce(std::net::TcpStream) + Send + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            peer(s);
        }
    });
    addr
}

#[test]
fn attaching_to_something_that_is_not_an_agent_says_so() {
    let http = fake_peer(|mut s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        std::thread::sleep(Duration::from_secs(2));
    });
    let err = AttachClient::connect(&http, None).unwrap_err();
    assert!(matches!(err, ClientError::NotAnAgent(_)), "{err:?}");
    assert_eq!(err.to_string(), format!("{http} is not an allocview agent"));
}

#[test]
fn attaching_to_a_peer_that_never_answers_gives_up_with_a_reason() {
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
    let silent = fake_peer(move |_s| {
        // Holds the connection open, saying nothing, until the test is over.
        let _ = done_rx.recv();
    });
    let err = AttachClient::connect(&silent, None).unwrap_err();
    drop(done_tx);
    assert!(matches!(err, ClientError::Silent { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "{silent} did not answer within {} s",
            CONNECT_TIMEOUT.as_secs()
        )),
        "{text}"
    );
}

/// The message and every cause below it, as anyhow's `{:#}` prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(&format!(": {c}"));
        cause = c.source();
    }
    out
}

#[test]
fn a_listener_that_cannot_bind_says_its_os_error_once_in_the_error_chain() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("x/nodir/x.sock");
    let err = Agent::builder()
        .listen(format!("unix:{}", missing.display()))
        .no_token()
        .spawn()
        .unwrap_err();
    let printed = chain(&err);
    assert!(
        printed.contains(&missing.display().to_string()),
        "{printed}"
    );
    assert_eq!(printed.matches("(os error").count(), 1, "{printed}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let err = Agent::builder()
        .listen(taken.local_addr().unwrap().to_string())
        .no_token()
        .spawn()
        .unwrap_err();
    let printed = chain(&err);
    assert_eq!(printed.matches("(os error 98)").count(), 1, "{printed}");
}

#[test]
fn a_refused_connection_says_its_os_error_once_in_the_error_chain() {
    let dir = tempfile::tempdir().unwrap();
    let Err(err) = AttachClient::connect(
        &format!("unix:{}", dir.path().join("none.sock").display()),
        None,
    ) else {
        panic!("connected to nothing");
    };
    let printed = chain(&err);
    assert_eq!(printed.matches("(os error").count(), 1, "{printed}");
}

#[test]
fn every_client_frames_wire_name_is_its_type_on_the_wire() {
    for frame in every_frame().1 {
        let json: serde_json::Value = serde_json::to_value(&frame).unwrap();
        assert_eq!(json["type"], frame.wire_name(), "{frame:?}");
    }
}

#[test]
fn a_frame_before_the_hello_is_refused_by_its_wire_name() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = unix_agent(dir.path());
    let mut s = raw_hello(&dir.path().join("agent.sock"));
    protocol::write_frame(&mut s, &ClientFrame::ResetPeaks).unwrap();
    match protocol::read_frame::<_, ServerFrame>(&mut s, MAX_SERVER_FRAME).unwrap() {
        ServerFrame::Error { message, .. } => {
            assert_eq!(message, "expected a hello, got reset_peaks");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    agent.shutdown();
}

#[test]
fn connections_that_never_say_hello_are_capped_and_the_newest_is_refused() {
    use allocview_agent::server::MAX_AWAITING_HELLO;
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let sock = dir.path().join("agent.sock");
    // Each silent connection has had its hello: the agent counts it as waiting.
    let mut silent: Vec<UnixStream> = (0..MAX_AWAITING_HELLO).map(|_| raw_hello(&sock)).collect();
    let mut over = UnixStream::connect(&sock).unwrap();
    over.set_read_timeout(Some(WAIT)).unwrap();
    match protocol::read_frame::<_, ServerFrame>(&mut over, MAX_SERVER_FRAME).unwrap() {
        ServerFrame::Error { message, fatal } => {
            assert!(fatal);
            assert!(message.contains("waiting for their hello"), "{message}");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    // And then the connection is closed.
    let mut rest = Vec::new();
    over.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    // A real client is told why.
    match AttachClient::connect(&addr, None) {
        Err(ClientError::Refused(message)) => {
            assert!(message.contains("waiting for their hello"), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // Once one silent connection goes away, a client gets in again.
    silent.pop();
    wait_until(|| AttachClient::connect(&addr, None).is_ok());
    drop(silent);
    agent.shutdown();
}

#[test]
fn a_connection_that_closes_without_a_goodbye_is_lost_not_a_shutdown() {
    let peer = fake_peer(|mut s| {
        let hello = ServerFrame::Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION,
            pid: 1,
            process: "gone".into(),
            token_required: false,
            update_interval_ms: 0,
        };
        protocol::write_frame(&mut s, &hello).unwrap();
        let _ = protocol::read_frame::<_, ClientFrame>(&mut s, protocol::MAX_CLIENT_FRAME);
        let full = ServerFrame::Full {
            state: Box::default(),
        };
        protocol::write_frame(&mut s, &full).unwrap();
        // Then the process "dies": the connection closes with no goodbye.
    });
    let mut client = AttachClient::connect(&peer, None).unwrap();
    let end = loop {
        match client.next_update(WAIT) {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert!(matches!(end, ClientError::ConnectionLost), "{end:?}");
    assert!(!end.is_agent_shutdown());
    assert!(end.to_string().contains("without a goodbye"), "{end}");
}

#[test]
fn a_relative_dump_folder_gives_absolute_dump_paths_that_any_folder_can_open() {
    let dir = tempfile::tempdir().unwrap();
    // The temporary folder named from this test's working folder: `..` up to the root. The
    // kernel resolves `..` through the physical path, so both are counted without links.
    let cwd = std::env::current_dir().unwrap().canonicalize().unwrap();
    let mut relative = std::path::PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    let target = dir.path().canonicalize().unwrap();
    relative.push(target.strip_prefix("/").unwrap());
    relative.push("dumps");
    assert!(relative.is_relative(), "{}", relative.display());
    let sock = dir.path().join("agent.sock");
    let toy = toy::Toy::new();
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(&relative)
        .provider(toy.clone())
        .tick(Duration::from_millis(5))
        .spawn()
        .unwrap();
    toy.set_sink(agent.sink());
    let mut client = AttachClient::connect(&format!("unix:{}", sock.display()), None).unwrap();
    toy.oom(1 << 30);
    agent.flush();
    wait_for(&mut client, |s| {
        s.ooms.first().is_some_and(|o| !o.dump_paths.is_empty())
    });
    // In the agent's own records and as sent to a client: absolute, naming the files written.
    let paths = client.state().ooms[0].dump_paths.clone();
    assert_eq!(agent.state().ooms[0].dump_paths, paths);
    for p in &paths {
        assert!(p.is_absolute(), "{}", p.display());
        assert!(p.is_file(), "{}", p.display());
        assert_eq!(
            p.parent().unwrap().canonicalize().unwrap(),
            dir.path().join("dumps").canonicalize().unwrap()
        );
    }
    agent.shutdown();
}
