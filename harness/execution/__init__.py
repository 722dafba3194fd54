"""Methods, plans and the engine: method specs (`method`), the matched-budget planner
(`planner`), the engine that serves strategies' requests in batched forwards (`engine`) and its
queues (`scheduler`)."""
