"""One compile: from `ncc compile`'s options to a NEFF, as a resumable pipeline of Luigi jobs.

    driver          CommandDriver: checks, runs the compile in a child process, handleError
    compile_child   the child process: one CompileCommand, result to driver_result.json
    compile_command CompileCommand: buildPipeline, work dir staleness, runPipeline (Luigi), output
    registry        JobRegistry: job name → its JobSpec class
    stages          the jobs, one JobSpec per stage tool (files in, files out, flags)
    jobspec         JobSpec: a job without Luigi (folder, record, completeness, cache key, restore)
    job             ToolJob: a JobSpec as a Luigi task (runs and supervises the tool, the record);
                    task_class_of(name) is a job name's Luigi task
    stage_cache     the content-addressed stage cache shared across work dirs and farms
    workdir         work directory layout, records, lock, history
    run_settings    run_settings.json: each compile's limits and allow-listed environment
    supervisor      one tool as a supervised process tree (limits, rusage, peak RSS, no stragglers)
    process_end     how a process ended → F134 / F137 / F139
    diskspace       naming a full file system ([U011])
    luigi_setup     Luigi configuration isolation and logging (also the farm's)
"""
