#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

use std::process::ExitCode;

use allocview::cli::{Cli, Command};
use allocview::{cmd, exit, output};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Some(Command::Demo(a)) => cmd::demo::run(a),
        Some(Command::Open(a)) => cmd::open::run(a),
        Some(Command::Summary(a)) => cmd::summary::run(a),
        Some(Command::Replay(a)) => cmd::replay::run(a),
        Some(Command::Export(a)) => cmd::export::run(a),
        Some(Command::Bench(a)) => cmd::bench::run(a),
        Some(Command::Screenshot(a)) => cmd::screenshot::run(a),
        None if cli.attach.is_some() => cmd::attach::run(&cli),
        None => {
            // No command is a usage error, as clap treats a missing argument: the help on
            // stderr (stdout stays empty for scripts), status 2. `--help` prints it on stdout
            // with status 0.
            use clap::CommandFactory;
            eprint!("{}", Cli::command().render_help());
            return ExitCode::from(exit::USAGE);
        }
    };
    match result {
        Ok(()) => ExitCode::from(exit::SUCCESS),
        // `allocview ... | head`: the reader has all it wanted.
        Err(e) if output::is_stdout_closed(&e) => ExitCode::from(exit::SUCCESS),
        Err(e) => {
            eprintln!("allocview: {e:#}");
            ExitCode::from(exit::status_of(&e))
        }
    }
}
