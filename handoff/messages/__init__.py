"""The NimBus messages: the contract of what endpoints and the resolver exchange, the outbound control message
a settlement stores and sends, and the Service Bus sender."""
