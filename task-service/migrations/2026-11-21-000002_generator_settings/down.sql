DROP TABLE generator_settings;
