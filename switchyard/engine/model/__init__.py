"""model: the model's shape (config), one rank's weights (weights, random_weights), projections (linear), the Llama-family decoder."""
