#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]

use std::process::ExitCode;

use allocview::cli::{Cli, Command};
use allocview::{cmd, output};
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
            use clap::CommandFactory;
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `allocview ... | head`: the reader has all it wanted.
        Err(e) if output::is_stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocview: {e:#}");
            ExitCode::FAILURE
        }
    }
}
