%%% EUnit tests of the agent's memory readings: the allocators' answer
%%% summed, /proc/PID/statm parsed, and whole readings of this VM and of
%%% a recorded proc root (test/fixtures/proc), bad files an error that
%%% keeps the VM's account.
-module(beamdiag_agent_memory_tests).
-include_lib("eunit/include/eunit.hrl").

%% The allocators' answer summed: instance 0's multi-block and single-block
%% carriers, instance 1's pool (whose carriers_size has one figure) and its
%% empty single-block carriers, as OTP 25 prints them; a disabled type and
%% another form are none; this VM's own answer adds up.
allocator_sizes_test() ->
    Answer = [{instance, 0,
               [{mbcs, [{blocks, [{binary_alloc, [{size, 59272, 1367328, 1367328}]}]},
                        {carriers_size, 65536, 1638400, 1638400}]},
                {sbcs, [{blocks, [{binary_alloc, [{size, 657104, 657104, 657104}]}]},
                        {carriers_size, 659456, 659456, 659456}]}]},
              {instance, 1,
               [{mbcs, [{blocks, [{binary_alloc, [{size, 4984, 7528, 7528}]}]},
                        {carriers_size, 65536, 65536, 65536}]},
                {mbcs_pool, [{blocks, [{eheap_alloc, [{size, 100}]}]}, {carriers_size, 32768}]},
                {sbcs, [{blocks, []}, {carriers_size, 0, 0, 0}]}]}],
    ?assertEqual(#{carriers => 65536 + 659456 + 65536 + 32768,
                   blocks => 59272 + 657104 + 4984 + 100},
                 beamdiag_agent_memory:allocator_sizes(Answer)),
    ?assertEqual(none, beamdiag_agent_memory:allocator_sizes(false)),
    ?assertEqual(none, beamdiag_agent_memory:allocator_sizes([{instance, 0, [{mbcs, nope}]}])),
    #{carriers := C, blocks := B} = beamdiag_agent_memory:allocator_sizes(
                                      erlang:system_info({allocator_sizes, eheap_alloc})),
    ?assert(C >= B andalso B > 0).

%% The agent's statm parser: pages to bytes, shared within resident, bad
%% input an error.
statm_test() ->
    ?assertEqual(#{rss => 40960, shared => 8192, anon => 32768},
                 beamdiag_agent_memory:parse_statm(<<"100 10 2 1 0 5 0\n">>, 4096)),
    ?assertMatch({error, {beamdiag_agent_memory, {bad_statm, _}}},
                 beamdiag_agent_memory:parse_statm(<<"garbage">>, 4096)),
    ?assertMatch({error, {beamdiag_agent_memory, {bad_statm, _}}},
                 beamdiag_agent_memory:parse_statm(<<"1 x 2">>, 4096)).

%% A reading of this VM through a proc root that holds a recorded statm:
%% the OS's account from the file, page by page; the VM's account and the
%% allocators' from this VM itself.
read_recorded_statm_test() ->
    {#{vm := Vm, os := Os, alloc := Alloc}, _} =
        in_root(<<"2500 1200 300 10 0 900 0\n">>, fun(Root) ->
            beamdiag_agent_memory:read(Root, 4242, beamdiag_agent_file:none(),
                                       beamdiag_agent_memory:vm_account(true))
        end),
    ?assertEqual(#{rss => 1200 * 4096, shared => 300 * 4096, anon => 900 * 4096}, Os),
    ?assertEqual(lists:sort([total, processes, system, atom, binary, code, ets]),
                 lists:sort(maps:keys(Vm))),
    #{total := Total, processes := P, system := S} = Vm,
    ?assertEqual(Total, P + S),
    #{eheap_alloc := #{carriers := C, blocks := B}} = Alloc,
    ?assert(C >= B andalso B > 0).

%% A statm that is not one, or none at all: the OS's account is the error,
%% the VM's is still read.
read_bad_statm_test() ->
    {#{vm := #{total := T}, os := Bad}, _} =
        in_root(<<"not numbers\n">>, fun(Root) ->
            beamdiag_agent_memory:read(Root, "4242", beamdiag_agent_file:none(),
                                       beamdiag_agent_memory:vm_account(true))
        end),
    ?assert(T > 0),
    ?assertMatch({error, {beamdiag_agent_memory, {bad_statm, <<"not numbers", _/binary>>}}}, Bad),
    {#{os := Missing}, _} =
        in_root(none, fun(Root) ->
            beamdiag_agent_memory:read(Root, 4242, beamdiag_agent_file:none(),
                                       beamdiag_agent_memory:vm_account(true))
        end),
    ?assertMatch({error, {beamdiag_agent_memory, {read, enoent}}}, Missing).

%% A middle tick: the VM's account and the resident pages the tick read
%% from the process's stat, as bytes.
read_vm_test() ->
    #{vm := #{total := T}, os := Os} = R =
        beamdiag_agent_memory:read_vm(1000, beamdiag_agent_memory:vm_account(false)),
    ?assert(T > 0),
    ?assertEqual(#{rss => 4096000}, Os),
    ?assertNot(is_map_key(alloc, R)).

%% A VM account that came too late (a scheduler held): the reading has the
%% OS's account, an empty VM's, and says why.
read_vm_missing_test() ->
    ?assertEqual(#{vm => #{}, vm_missing => timeout, os => #{rss => 8192}},
                 beamdiag_agent_memory:read_vm(2, {missing, timeout})),
    {R, _} = in_root(<<"2500 1200 300 10 0 900 0\n">>, fun(Root) ->
                 beamdiag_agent_memory:read(Root, 4242, beamdiag_agent_file:none(), {missing, busy})
             end),
    ?assertEqual(#{vm => #{}, vm_missing => busy,
                   os => #{rss => 1200 * 4096, shared => 300 * 4096, anon => 900 * 4096}}, R).

%% The node's own statm, read through /proc: resident memory within the
%% VM's own account's order, anonymous plus shared the resident.
read_own_statm_test() ->
    {#{vm := #{total := T}, os := #{rss := R, anon := A, shared := S}}, _} =
        beamdiag_agent_memory:read("/proc", os:getpid(), beamdiag_agent_file:none(),
                                       beamdiag_agent_memory:vm_account(true)),
    ?assertEqual(R, A + S),
    ?assert(R > T div 4).

%% Fun run on a new proc root whose process 4242 has that statm (none: no
%% file), removed after.
in_root(Statm, Fun) ->
    Root = beamdiag_tmp:path("agent_memory_tests"),
    ok = filelib:ensure_dir(filename:join([Root, "4242", "x"])),
    _ = [ok = file:write_file(filename:join([Root, "4242", "statm"]), Statm) || is_binary(Statm)],
    try Fun(Root)
    after file:del_dir_r(Root)
    end.

%% The allocators' account in one request for every type names the same
%% types, with the same carriers-and-blocks form, as one request a type:
%% each enabled alloc_util type, carriers holding their blocks.
allocators_one_request_test() ->
    #{alloc := Alloc} = beamdiag_agent_memory:vm_account(true),
    Each = [T || T <- erlang:system_info(alloc_util_allocators),
                 is_map(beamdiag_agent_memory:allocator_sizes(
                          erlang:system_info({allocator_sizes, T})))],
    ?assertEqual(lists:sort(Each), lists:sort(maps:keys(Alloc))),
    ?assert(lists:all(fun(#{carriers := C, blocks := B}) -> C >= B end, maps:values(Alloc))).
