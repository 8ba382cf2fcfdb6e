//! Hostile and careless attach clients: a hello trickled one byte at a time (slowloris), and
//! what the agent's host must keep doing meanwhile.

#[path = "support/raw_client.rs"]
mod raw_client;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_agent::client::AttachClient;
use allocview_agent::protocol::{
    self, ClientFrame, MAGIC, MAX_SERVER_FRAME, PROTOCOL_VERSION, ServerFrame,
};
use allocview_agent::server::{HELLO_TIMEOUT, MAX_AWAITING_HELLO};
use raw_client::{raw_hello, unix_agent};

/// A valid client hello, as bytes on the wire.
fn hello_bytes() -> Vec<u8> {
    protocol::encode_frame(&ClientFrame::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        token: None,
    })
    .unwrap()
}

/// Writes `bytes` to `s` one at a time, `pause` apart, until done or the agent hangs up.
fn trickle(mut s: UnixStream, bytes: Vec<u8>, pause: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for b in bytes {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(pause);
        }
    })
}

#[test]
fn a_hello_trickled_a_byte_at_a_time_is_cut_off_at_the_hello_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = unix_agent(dir.path());
    let sock = dir.path().join("agent.sock");
    let mut s = raw_hello(&sock);
    // Each byte well within the timeout of one read, the whole hello far beyond it.
    let pause = HELLO_TIMEOUT / 5;
    let bytes = hello_bytes();
    assert!(pause * bytes.len() as u32 > HELLO_TIMEOUT * 4);
    let writer = trickle(s.try_clone().unwrap(), bytes, pause);
    match protocol::read_frame::<_, ServerFrame>(&mut s, MAX_SERVER_FRAME) {
        Ok(ServerFrame::Error { message, fatal }) => {
            assert!(fatal);
            assert!(message.contains("no hello within"), "{message}");
        }
        other => panic!("expected the hello timeout's error frame, got {other:?}"),
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed after the error");
    let _ = s.shutdown(std::net::Shutdown::Both);
    writer.join().unwrap();
    let refused = &agent.state().pipeline.refused_clients;
    assert!(
        refused.iter().any(|(r, n)| r == "hello_timeout" && *n == 1),
        "{refused:?}"
    );
    agent.shutdown();
}

#[test]
fn trickling_connections_cannot_hold_the_hello_slots_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let sock = dir.path().join("agent.sock");
    let pause = HELLO_TIMEOUT / 5;
    let writers: Vec<_> = (0..MAX_AWAITING_HELLO)
        .map(|_| {
            let s = raw_hello(&sock);
            trickle(s, hello_bytes(), pause)
        })
        .collect();
    // Once the slow hellos have had their time, a real client gets in while they still trickle.
    let deadline = std::time::Instant::now() + raw_client::WAIT;
    loop {
        match AttachClient::connect(&addr, None) {
            Ok(_) => break,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "no client got in while slow hellos trickled: {e}"
            ),
        }
        std::thread::sleep(pause);
    }
    for w in writers {
        w.join().unwrap();
    }
    agent.shutdown();
}

/// A folder of sockets holding a live agent's, with `mode`.
fn socket_dir_with_agent(mode: u32) -> (tempfile::TempDir, std::path::PathBuf, Agent) {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("allocview");
    std::fs::create_dir(&dir).unwrap();
    let agent = Agent::builder()
        .listen(format!("unix:{}", dir.join("1234.sock").display()))
        .dump_dir(root.path().join("dumps"))
        .spawn()
        .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    (root, dir, agent)
}

#[test]
fn discovery_does_not_trust_a_socket_folder_others_can_write_to() {
    let (_root, dir, agent) = socket_dir_with_agent(0o777);
    let found = allocview_agent::client::find_sockets_in(&dir);
    assert!(found.sockets.is_empty(), "{:?}", found.sockets);
    let why = found.untrusted.expect("the folder is refused");
    assert!(why.contains("writable by other users"), "{why}");
    assert!(why.contains("777"), "{why}");
    assert!(why.contains("--attach"), "{why}");
    // Private again: the agent is found.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let found = allocview_agent::client::find_sockets_in(&dir);
    assert_eq!(found.sockets.len(), 1);
    assert_eq!(found.untrusted, None);
    agent.shutdown();
}

#[test]
fn discovery_does_not_trust_a_socket_folder_of_another_user() {
    let (_root, dir, agent) = socket_dir_with_agent(0o700);
    // `nobody`; only root may give a folder away.
    let given = std::process::Command::new("chown")
        .args(["65534", dir.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if !given {
        println!("skipped: cannot give a folder to another user (not root)");
        agent.shutdown();
        return;
    }
    let found = allocview_agent::client::find_sockets_in(&dir);
    assert!(found.sockets.is_empty(), "{:?}", found.sockets);
    let why = found.untrusted.expect("the folder is refused");
    assert!(why.contains("belongs to another user (uid 65534"), "{why}");
    agent.shutdown();
}

#[test]
fn discovery_does_not_follow_a_symbolic_link_for_the_socket_folder() {
    let (root, dir, agent) = socket_dir_with_agent(0o700);
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let found = allocview_agent::client::find_sockets_in(&link);
    assert!(found.sockets.is_empty(), "{:?}", found.sockets);
    let why = found.untrusted.expect("the link is refused");
    assert!(why.contains("symbolic link"), "{why}");
    agent.shutdown();
}

/// A raw client past its hello: the agent's `full` read.
fn attached_raw(sock: &std::path::Path) -> UnixStream {
    let mut s = raw_hello(sock);
    raw_client::send_hello(&mut s);
    match protocol::read_frame::<_, ServerFrame>(&mut s, MAX_SERVER_FRAME).unwrap() {
        ServerFrame::Full { .. } => s,
        other => panic!("expected the full state, got {other:?}"),
    }
}

#[test]
fn attached_clients_are_capped_and_one_over_the_cap_is_told_why() {
    use allocview_agent::server::MAX_CLIENTS;
    let dir = tempfile::tempdir().unwrap();
    let (agent, addr) = unix_agent(dir.path());
    let sock = dir.path().join("agent.sock");
    // Clients that never read: each would cost two threads, without a cap.
    let mut attached: Vec<UnixStream> = (0..MAX_CLIENTS).map(|_| attached_raw(&sock)).collect();
    let mut over = raw_hello(&sock);
    raw_client::send_hello(&mut over);
    match protocol::read_frame::<_, ServerFrame>(&mut over, MAX_SERVER_FRAME) {
        Ok(ServerFrame::Error { message, fatal }) => {
            assert!(fatal);
            assert!(message.contains("too many clients attached"), "{message}");
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    let mut rest = Vec::new();
    over.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed after the error");
    // A real client is told why, too.
    match AttachClient::connect(&addr, None) {
        Err(allocview_agent::client::ClientError::Refused(m)) => {
            assert!(m.contains("too many clients attached"), "{m}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    let refused = agent.state().pipeline.refused_clients;
    assert!(
        refused.iter().any(|(r, n)| r == "client_cap" && *n == 2),
        "{refused:?}"
    );
    // One leaves: another gets in.
    attached.pop();
    let deadline = std::time::Instant::now() + raw_client::WAIT;
    while AttachClient::connect(&addr, None).is_err() {
        assert!(std::time::Instant::now() < deadline, "no room freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(attached);
    agent.shutdown();
}

#[test]
fn attaching_to_a_peer_that_trickles_its_hello_gives_up_at_the_connect_timeout() {
    use allocview_agent::client::{CONNECT_TIMEOUT, ClientError};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hello = protocol::encode_frame(&ServerFrame::Hello {
        magic: MAGIC.into(),
        version: PROTOCOL_VERSION,
        pid: 1,
        process: "slow".into(),
        token_required: false,
        update_interval_ms: 100,
    })
    .unwrap();
    let pause = CONNECT_TIMEOUT / 5;
    assert!(pause * hello.len() as u32 > CONNECT_TIMEOUT * 4);
    let peer = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        for b in hello {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(pause);
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(AttachClient::connect(&addr, None).map(|_| ()));
    });
    match rx.recv_timeout(raw_client::WAIT) {
        Ok(Err(ClientError::Silent { .. })) => {}
        Ok(other) => panic!("expected the peer to count as silent, got {other:?}"),
        Err(_) => panic!("connect still waiting for a hello trickled a byte at a time"),
    }
    peer.join().unwrap();
}

/// Set in a child run of the test below: spawn an agent at the default address and print
/// what came of it.
const SPAWN_DEFAULT_CHILD: &str = "ALLOCVIEW_TEST_SPAWN_DEFAULT_CHILD";

/// Runs this test binary's `test` again with `XDG_RUNTIME_DIR` set to `runtime`, and returns
/// what its child branch printed.
fn spawn_default_in_child(test: &str, runtime: &std::path::Path) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(SPAWN_DEFAULT_CHILD, runtime.join("dumps"))
        .env("XDG_RUNTIME_DIR", runtime)
        .env_remove("ALLOCVIEW_ADDR")
        .env_remove("ALLOCVIEW_TOKEN")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn an_agent_refuses_a_default_socket_folder_it_cannot_trust_and_says_what_to_do() {
    const TEST: &str =
        "an_agent_refuses_a_default_socket_folder_it_cannot_trust_and_says_what_to_do";
    if let Some(dumps) = std::env::var_os(SPAWN_DEFAULT_CHILD) {
        match Agent::builder().dump_dir(dumps).spawn() {
            Ok(agent) => {
                println!("SPAWNED");
                agent.shutdown();
            }
            Err(e) => println!("REFUSED: {e}"),
        }
        return;
    }
    // A symbolic link to a folder elsewhere: not followed, nothing created there.
    let runtime = tempfile::tempdir().unwrap();
    let elsewhere = runtime.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, runtime.path().join("allocview")).unwrap();
    let said = spawn_default_in_child(TEST, runtime.path());
    assert!(said.contains("REFUSED"), "{said}");
    assert!(said.contains("is a symbolic link"), "{said}");
    assert!(said.contains("ALLOCVIEW_ADDR"), "{said}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // A file.
    let runtime = tempfile::tempdir().unwrap();
    std::fs::write(runtime.path().join("allocview"), b"").unwrap();
    let said = spawn_default_in_child(TEST, runtime.path());
    assert!(said.contains("exists and is not a folder"), "{said}");
    assert!(said.contains("ALLOCVIEW_ADDR"), "{said}");
    // Pre-created by us with mode 0777: made private, and used.
    use std::os::unix::fs::PermissionsExt as _;
    let runtime = tempfile::tempdir().unwrap();
    let dir = runtime.path().join("allocview");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let said = spawn_default_in_child(TEST, runtime.path());
    assert!(said.contains("SPAWNED"), "{said}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    // Another user's (only root can make one).
    let given = std::process::Command::new("chown")
        .args(["65534", dir.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if given {
        let said = spawn_default_in_child(TEST, runtime.path());
        assert!(
            said.contains("belongs to another user (uid 65534"),
            "{said}"
        );
        assert!(said.contains("ALLOCVIEW_ADDR"), "{said}");
    } else {
        println!("skipped the other user's folder: not root");
    }
}

#[test]
fn discovery_leaves_out_a_socket_of_another_user_in_a_private_folder() {
    let (_root, dir, agent) = socket_dir_with_agent(0o700);
    let sock = dir.join("1234.sock");
    // Given to `nobody` (only root can): as a socket another user put there before the
    // folder was made private would be.
    let given = std::process::Command::new("chown")
        .args(["65534", sock.to_str().unwrap()])
        .status()
        .is_ok_and(|s| s.success());
    if !given {
        println!("skipped: cannot give a socket to another user (not root)");
        agent.shutdown();
        return;
    }
    let found = allocview_agent::client::find_sockets_in(&dir);
    assert!(found.sockets.is_empty(), "{:?}", found.sockets);
    assert_eq!(found.untrusted, None);
    assert!(sock.exists(), "left alone");
    agent.shutdown();
}
