"""The lockstep machine against InMemoryTransport, sync and async."""

from twin_support import twin_settings
from harel_ref.stateful import make_machine
from harel_ref.stateful.backends.memory import memory, memory_async

TestMemoryMachine = make_machine(memory()).TestCase
TestAsyncMemoryMachine = make_machine(memory_async()).TestCase
TestAsyncMemoryMachine.settings = twin_settings(TestAsyncMemoryMachine.settings)
