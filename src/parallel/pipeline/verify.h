// The verifier: proves a schedule safe to execute before any rank runs it.
//  - shape: one list per rank; every action's chunk lives on that rank; ids in range;
//  - complete: every microbatch passes every chunk forward exactly once and backward exactly
//    once (B, or for split schedules I and then W, never both forms), B after its F, W after
//    its I;
//  - dependencies: F(mb, c) after F(mb, c − 1) — on the same rank earlier in the list, or on
//    another rank through a matching SendAct / RecvAct pair (send after the producer, receive
//    before the consumer, right peers); backward likewise from c + 1 to c;
//  - every send has exactly one matching receive and the other way round;
//  - no deadlock: the lists are replayed under the communication semantics (asynchronous
//    sends, blocking receives) and must all run to the end; a batched lowering also under
//    NCCL's rendezvous (a send waits for its receive; replay_rendezvous), and each rank must
//    send to a peer in the order the peer receives (NCCL matches in order, not by tag).
#pragma once

#include <string>

#include "parallel/pipeline/schedule.h"

namespace mt::parallel::pp {

// "" when the schedule is valid, else what is wrong (the first problem found).
std::string verify(const Schedule& s);

// Throws mt::Error (a run failure: the schedule is a bug, not the user's input) if invalid.
void verify_or_throw(const Schedule& s);

}  // namespace mt::parallel::pp
