//! `allocview --attach` without an address looks in the default folder of sockets only when
//! that folder is private to the user: one that other users can write to may hold a socket of
//! theirs posing as an agent, to read the token the client presents.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use allocview_agent::agent::Agent;

const BIN: &str = env!("CARGO_BIN_EXE_allocview");

#[test]
fn attach_refuses_a_default_socket_folder_others_can_write_to_and_says_why() {
    let runtime = tempfile::tempdir().unwrap();
    let dir = runtime.path().join("allocview");
    std::fs::create_dir(&dir).unwrap();
    let agent = Agent::builder()
        .listen(format!("unix:{}", dir.join("4242.sock").display()))
        .dump_dir(runtime.path().join("dumps"))
        .spawn()
        .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(BIN)
        .args(["--attach", "--headless", "--once", "--json"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env_remove("ALLOCVIEW_ADDR")
        .env("ALLOCVIEW_TOKEN", "s3cret")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(out.stdout.is_empty(), "attached anyway");
    assert!(err.contains("writable by other users"), "{err}");
    assert!(
        err.contains("may not be an agent's; remove it (an agent makes it again, private)"),
        "said in one line, no runs of spaces: {err}"
    );
    assert!(err.contains(&dir.display().to_string()), "{err}");
    // Private again, the same command attaches.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(BIN)
        .args(["--attach", "--headless", "--once", "--json"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env_remove("ALLOCVIEW_ADDR")
        .env_remove("ALLOCVIEW_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent.shutdown();
}
