//! A client over a raw unix socket, for tests that speak the attach protocol frame by frame
//! (an `AttachClient` would hide the frames, and read on a thread of its own).

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use allocview_agent::agent::Agent;
use allocview_agent::protocol::{
    self, ClientFrame, MAGIC, MAX_SERVER_FRAME, PROTOCOL_VERSION, ServerFrame,
};

/// How long a test waits for the agent (a frame, a condition) before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Connects to the agent at `sock` and reads its hello (of this protocol version); reads time
/// out after [`WAIT`].
pub fn raw_hello(sock: &Path) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let hello: ServerFrame = protocol::read_frame(&mut s, MAX_SERVER_FRAME).unwrap();
    assert!(
        matches!(
            hello,
            ServerFrame::Hello {
                version: PROTOCOL_VERSION,
                ..
            }
        ),
        "{hello:?}"
    );
    s
}

/// Sends a client's hello of this protocol version, without a token.
pub fn send_hello(s: &mut UnixStream) {
    protocol::write_frame(
        s,
        &ClientFrame::Hello {
            magic: MAGIC.into(),
            version: PROTOCOL_VERSION,
            token: None,
        },
    )
    .unwrap();
}

/// An agent in this process listening on `dir/agent.sock` (dumps in `dir/dumps`, a 5 ms tick),
/// and its address.
#[allow(dead_code)]
pub fn unix_agent(dir: &Path) -> (Agent, String) {
    let sock = dir.join("agent.sock");
    let agent = Agent::builder()
        .listen(format!("unix:{}", sock.display()))
        .dump_dir(dir.join("dumps"))
        .tick(Duration::from_millis(5))
        .spawn()
        .unwrap();
    (agent, format!("unix:{}", sock.display()))
}
